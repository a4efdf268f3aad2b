"""The jobs of the rendezvous tests: a rank late to a step, a failure one rank alone knows of (spawned gloo processes)."""

from __future__ import annotations

import time


def late_steps(rank: int, nproc: int, job: dict) -> list[tuple[str, float]]:
    """``len(job["sleeps"])`` steps of the demo MLP; before step ``i`` rank ``job["late"]`` sleeps
    ``job["sleeps"][i]`` seconds (no barrier between steps). What each step raised on this rank ('' where it
    returned) and the seconds it took."""
    from pipeforge.runtime import PipelineError
    from pipeforge.tools import demo_models as models
    from pipeforge.tools.generated import load_module

    generated = load_module(job["path"])
    info = generated.SCHEDULE
    full = models.build_stages("mlp", info.stages, seed=0)
    pipe = generated.make_pipeline({s: full[s] for s in info.stages_of(rank)}, loss_fn=models.loss_fn,
                                   timeout=job["wait"])
    x, y = models.make_batch(info.stages, 8, seed=0)
    seen = []
    for sleep in job["sleeps"]:
        if rank == job["late"]:
            time.sleep(sleep)
        started = time.monotonic()
        try:
            pipe.step(*((x,) if pipe.holds_first else ()), target=y if pipe.holds_last else None)
            seen.append(("", time.monotonic() - started))
        except PipelineError as error:
            seen.append((str(error), time.monotonic() - started))
    return seen


def last_backward_fails(rank: int, nproc: int, job: dict) -> list[tuple[str, float]]:
    """``job.get("steps", 3)`` steps of the demo MLP, the step-end agreement ``job["agree"]``; in the second, stage 0's last
    backward raises (its rank's last action, which no rank waits for: the others end their step without a
    wait that breaks). What each step raised on this rank ('' where it returned) and the seconds it took."""
    import torch

    from pipeforge.runtime import PipelineError
    from pipeforge.tools import demo_models as models
    from pipeforge.tools.generated import load_module

    class Raise(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x.view_as(x)

        @staticmethod
        def backward(ctx, grad):
            raise ValueError("a bad gradient")

    class FailsLast(torch.nn.Module):
        def __init__(self, inner: torch.nn.Module, microbatches: int):
            super().__init__()
            self.inner, self.microbatches, self.armed, self.calls = inner, microbatches, False, 0

        def forward(self, x):
            self.calls += 1
            out = self.inner(x)
            last = self.armed and self.calls == self.microbatches
            return Raise.apply(out) if last else out

    generated = load_module(job["path"])
    info = generated.SCHEDULE
    full = models.build_stages("mlp", info.stages, seed=0)
    mine = {s: FailsLast(full[s], info.microbatches) if s == 0 else full[s] for s in info.stages_of(rank)}
    pipe = generated.make_pipeline(mine, loss_fn=models.loss_fn, timeout=job["wait"])
    pipe.preflight = False  # the failure is inside step(): no check's forward before it (it counts forwards)
    pipe.end_agreement = job["agree"]
    x, y = models.make_batch(info.stages, 8, seed=0)
    seen = []
    for index in range(job.get("steps", 3)):
        if 0 in mine:
            mine[0].armed, mine[0].calls = index == 1, 0
        started = time.monotonic()
        try:
            pipe.step(*((x,) if pipe.holds_first else ()), target=y if pipe.holds_last else None)
            seen.append(("", time.monotonic() - started))
        except PipelineError as error:
            seen.append((str(error), time.monotonic() - started))
    return seen
