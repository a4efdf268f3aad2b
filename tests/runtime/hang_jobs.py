"""A generated pipeline's step on gloo that may be made to hang or fail, leaving records.

``run_hang(rank, nproc, job)`` loads the generated module ``job["module"]`` (edited
by hand or not), builds a ``Linear`` + ``tanh`` per stage (float64), and runs one
``step`` with ``make_pipeline(timeout=job["timeout"], records=job["records"])`` (or,
with ``job["environment"]``, ``PIPEFORGE_RECORDS`` instead of the argument). A
stage named in ``job["stop"]`` sleeps (a rank that stops) or raises (a rank that
fails) on its n-th forward. Returns ``("ok", None)`` or ``("failed", message with notes)``.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import time

import torch

WIDTH = 4


class Stage(torch.nn.Module):
    def __init__(self, stage: int, stop: dict | None):
        super().__init__()
        torch.manual_seed(100 + stage)
        self.linear = torch.nn.Linear(WIDTH, WIDTH).double()
        self.stage = stage
        self.stop = stop if stop and stop["stage"] == stage else None
        self.calls = 0

    def forward(self, x):
        if self.stop is not None:
            if self.calls == self.stop["call"]:
                if self.stop["how"] == "sleep":
                    time.sleep(600)
                raise RuntimeError(f"stage {self.stage} fails on purpose")
            self.calls += 1
        return torch.tanh(self.linear(x))


def load(path: str, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # records find the module's file through it
    spec.loader.exec_module(module)
    return module


def run_hang(rank: int, nproc: int, job: dict):
    module = load(job["module"], f"hang_pipeline_{rank}")
    stages = module.stages_of_rank(rank)
    modules = {s: Stage(s, job.get("stop")) for s in stages}
    info = module.SCHEDULE
    if job.get("environment"):
        os.environ["PIPEFORGE_RECORDS"] = job["records"]
        records = None
    else:
        records = job["records"]
    pipe = module.make_pipeline(modules, loss_fn=torch.nn.functional.mse_loss, timeout=job["timeout"],
                                records=records)
    pipe.preflight = False  # the fault is inside step(): no check's forward before it (it counts forwards)
    torch.manual_seed(0)
    x = torch.randn(2 * info.microbatches, WIDTH, dtype=torch.float64)
    y = torch.randn(2 * info.microbatches, WIDTH, dtype=torch.float64)
    try:
        pipe.step(*((x,) if 0 in stages else ()), target=y if info.stages - 1 in stages else None)
    except Exception as error:  # noqa: BLE001 (the test reads what the error says)
        return ("failed", "\n".join([str(error), *getattr(error, "__notes__", [])]))
    return ("ok", None)


def flight_recorder_dump(rank: int, nproc: int, payload) -> str:
    """torch's CPU flight recorder after a gloo send/receive and an unmatched receive, as JSON text."""
    import torch.distributed as dist
    from torch._C._distributed_c10d import _dump_fr_trace_json

    os.environ["TORCH_FR_BUFFER_SIZE"] = "100"
    group = dist.new_group([0, 1])  # created after the buffer size is set
    tensor = torch.ones(3)
    if rank == 0:
        dist.send(tensor, 1, group=group)
    else:
        dist.recv(tensor, 0, group=group)
        dist.irecv(tensor, 0, group=group)  # never matched: what a hang would leave pending
    dump = _dump_fr_trace_json(True, True)
    return dump.decode() if isinstance(dump, bytes) else dump
