"""What the side-by-side runtime benchmarks share (``gpt``, ``mlp``, ``fsdp`` of ``benchmarks.runtime``).

Each benchmark spawns N local processes (``spawn``); on every rank it builds the
same stage modules twice and times pipeforge's pipeline against torch's schedule
with ``measure_pair``: steps alternate between the two, each after a barrier, and
which of a pair runs first alternates too, so a pair shares the machine's load
and neither gains from the other's leftovers. ``summarize`` turns the ranks'
records of one configuration into the reported row: the slowest rank's time of
each step, the medians, the median of the per-step ratios pipeforge / torch (the
target is at most 1.0), the same ratio for CPU time summed over the ranks (the
work each runtime does, which other load on the machine disturbs far less than
wall time), and the first step's worst relative gradient difference.
"""

from __future__ import annotations

import importlib.util
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from pipeforge.tools.launch import Outcome, spawn

SIDES = ("pipeforge", "torch")
TOLERANCE = 1e-4  # relative gradient difference above which a benchmark reports a mismatch
EXAMPLE_GPT = Path(__file__).resolve().parents[2] / "examples" / "gpt.py"


def example_gpt():
    """``examples/gpt.py`` (not a package: the example runs as a script beside it), imported once."""
    name = "examples_gpt"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, EXAMPLE_GPT)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # before running it: its dataclasses look their module up there
        spec.loader.exec_module(module)
    return sys.modules[name]


# -- on every rank -------------------------------------------------------------------------------

def timed_step(step: Callable[[], Any], device=None) -> tuple[float, float, float]:
    """Wall time, this process's CPU time (all its threads: the backend's too) and the CPU time of
    the calling thread (the runtime's own Python and the compute it runs) of one step, started after
    a barrier."""
    import torch
    import torch.distributed as dist

    dist.barrier()
    cuda = device is not None and device.type == "cuda"
    if cuda:
        torch.cuda.synchronize()
    started, cpu_started, thread_started = time.perf_counter(), time.process_time(), time.thread_time()
    step()
    if cuda:
        torch.cuda.synchronize()
    return time.perf_counter() - started, time.process_time() - cpu_started, time.thread_time() - thread_started


def measure_pair(ours: Callable[[], Any], theirs: Callable[[], Any], *, steps: int, warmup: int,
                 modules: Iterable = (), compare: Callable[[], float] | None = None, device=None) -> dict:
    """Alternate ``ours`` (pipeforge) and ``theirs`` (torch) for ``warmup + steps`` pairs of steps.

    After the first pair ``compare()`` gives the gradient difference; after every pair the
    ``modules``' gradients are cleared. Returns this rank's record: ``times``, ``cpu`` and ``main``
    (the calling thread's CPU) per side, the measured steps only, and ``mismatch``.
    """
    modules = list(modules)
    record: dict = {key: {s: [] for s in SIDES} for key in ("times", "cpu", "main")}
    record["mismatch"] = 0.0
    for step in range(warmup + steps):
        pair = (("pipeforge", ours), ("torch", theirs))
        measured = {side: timed_step(run, device) for side, run in (pair if step % 2 == 0 else pair[::-1])}
        if step == 0 and compare is not None:
            record["mismatch"] = compare()
        for module in modules:
            module.zero_grad(set_to_none=True)
        if step < warmup:
            continue
        for side, (wall, cpu, main) in measured.items():
            record["times"][side].append(wall)
            record["cpu"][side].append(cpu)
            record["main"][side].append(main)
    return record


def torch_schedule(class_name: str, modules: dict, stages: int, microbatches: int, loss_fn, *, device=None,
                   group=None):
    """torch's schedule class ``class_name`` over real ``PipelineStage`` objects of this rank's ``modules``."""
    import torch
    from torch.distributed.pipelining import PipelineStage, schedules

    device = device if device is not None else torch.device("cpu")
    pipeline_stages = [PipelineStage(m, s, stages, device, group=group) for s, m in sorted(modules.items())]
    cls = getattr(schedules, class_name)
    if issubclass(cls, schedules.PipelineScheduleSingle):
        return cls(pipeline_stages[0], microbatches, loss_fn=loss_fn)
    return cls(pipeline_stages, microbatches, loss_fn=loss_fn)


def gradients(modules: dict, full: bool = False) -> list:
    """Every parameter's gradient, stage by stage (``full``: DTensor gradients gathered whole)."""
    grads = [p.grad for _, m in sorted(modules.items()) for p in m.parameters() if p.grad is not None]
    return [(g.full_tensor() if full else g).detach().clone() for g in grads]


def max_relative_difference(ours: list, theirs: list) -> float:
    if len(ours) != len(theirs):
        return float("inf")
    worst = 0.0
    for a, b in zip(ours, theirs):
        worst = max(worst, (a - b).abs().max().item() / max(b.abs().max().item(), 1e-12))
    return worst


def mse_loss(output, target):
    import torch

    return torch.nn.functional.mse_loss(output, target)


def gather_on_rank0(rank: int, nproc: int, records: dict) -> dict:
    """Every rank's ``{configuration: record}``; rank 0 returns ``{configuration: summarize(...)}``."""
    import torch.distributed as dist

    gathered: list = [None] * nproc
    dist.all_gather_object(gathered, records)
    if rank != 0:
        return {}
    return {key: summarize([r[key] for r in gathered]) for key in gathered[0]}


# -- in the parent -------------------------------------------------------------------------------

def summarize(records: list[dict]) -> dict:
    """One configuration's row from every rank's ``measure_pair`` record."""
    slowest = {side: [max(step) for step in zip(*(r["times"][side] for r in records))] for side in SIDES}
    work = {side: [sum(step) for step in zip(*(r["cpu"][side] for r in records))] for side in SIDES}
    main = {side: [sum(step) for step in zip(*(r["main"][side] for r in records))] for side in SIDES}
    return {
        "pipeforge": statistics.median(slowest["pipeforge"]),
        "torch": statistics.median(slowest["torch"]),
        "ratio": _median_ratio(slowest),
        "cpu_pipeforge": statistics.median(work["pipeforge"]),
        "cpu_torch": statistics.median(work["torch"]),
        "cpu_ratio": _median_ratio(work),
        "main_pipeforge": statistics.median(main["pipeforge"]),
        "main_torch": statistics.median(main["torch"]),
        "main_ratio": _median_ratio(main),
        "ratio_interval": _ratio_interval(slowest),
        "main_interval": _ratio_interval(main),
        "mismatch": max(r["mismatch"] for r in records),
        "steps": len(slowest["pipeforge"]),
    }


def _median_ratio(values: dict[str, list[float]]) -> float:
    """The median over steps of pipeforge / torch (steps where torch took no time left out)."""
    ratios = [a / b for a, b in zip(values["pipeforge"], values["torch"]) if b > 0]
    return statistics.median(ratios) if ratios else float("nan")


def _ratio_interval(values: dict[str, list[float]]) -> tuple[float, float]:
    """The distribution-free 95 % interval of the median per-step ratio (``benchmarks.profile.loop``'s)."""
    from benchmarks.profile.loop import median_interval

    ratios = [a / b for a, b in zip(values["pipeforge"], values["torch"]) if b > 0]
    return median_interval(ratios) if ratios else (float("nan"), float("nan"))


def run_ranks(worker, nproc: int, config: Any, *, timeout: float, deadline: float, backend: str = "gloo"
              ) -> tuple[list[Outcome], str]:
    """``spawn`` the worker; the outcomes, and the first error ('' when every rank succeeded)."""
    outcomes = spawn(worker, nproc, config, timeout=timeout, backend=backend, deadline=deadline)
    return outcomes, first_error(outcomes)


def first_error(outcomes: list[Outcome]) -> str:
    """The failed rank that says why (its peers only report the lost connection), '' when none failed."""
    failed = sorted((o for o in outcomes if not o.ok),
                    key=lambda o: ("Connection closed" in o.error or "failed (waits" in o.error, o.rank))
    if not failed:
        return ""
    lines = [line for line in failed[0].error.strip().splitlines() if line.strip()] or ["(no message)"]
    return f"rank {failed[0].rank}: {lines[-1].strip()}"


def load_average() -> str:
    """The machine's 1, 5 and 15 minute load averages and its core count, to print beside the numbers."""
    one, five, fifteen = os.getloadavg()
    return f"load average {one:.2f} {five:.2f} {fifteen:.2f} on {os.cpu_count()} cores"


def legend() -> str:
    return ("ms: median over steps of the slowest rank; ratio: median over steps of pipeforge / torch "
            "(<= 1.0 is the target); cpu ratio: the same for CPU time summed over the ranks (all threads); "
            "main ratio: for the CPU time of the thread that runs the schedule (the runtime's own work)")
