"""The jobs of the rendezvous tests: a rank late to a step, a failure one rank alone knows of (spawned gloo processes)."""

from __future__ import annotations

import time

import torch

from pipeforge.tools import demo_models as models
from tests.demo_jobs import RaisesInBackward, demo_pipeline, timed_step


def late_steps(rank: int, nproc: int, job: dict) -> list[tuple[str, float]]:
    """``len(job["sleeps"])`` steps of the demo MLP; before step ``i`` rank ``job["late"]`` sleeps
    ``job["sleeps"][i]`` seconds (no barrier between steps). What each step raised on this rank ('' where it
    returned) and the seconds it took."""
    pipe = demo_pipeline(job, rank)
    x, y = models.make_batch(pipe.info.stages, 8, seed=0)
    seen = []
    for sleep in job["sleeps"]:
        if rank == job["late"]:
            time.sleep(sleep)
        seen.append(timed_step(pipe, x, y))
    return seen


class FailsLast(torch.nn.Module):
    """``inner``, whose output's backward raises at forward number ``armed`` (counting from 1; 0: never)."""

    def __init__(self, inner: torch.nn.Module):
        super().__init__()
        self.inner, self.armed, self.calls = inner, 0, 0

    def forward(self, x):
        self.calls += 1
        out = self.inner(x)
        return RaisesInBackward.apply(out) if self.calls == self.armed else out


def last_backward_fails(rank: int, nproc: int, job: dict) -> list[tuple[str, float]]:
    """``job.get("steps", 3)`` steps of the demo MLP, the step-end agreement ``job["agree"]``; in the second, stage 0's last
    backward raises (its rank's last action, which no rank waits for: the others end their step without a
    wait that breaks). What each step raised on this rank ('' where it returned) and the seconds it took."""
    pipe = demo_pipeline(job, rank, lambda stage, module: FailsLast(module) if stage == 0 else module)
    pipe.preflight = False  # the failure is inside step(): no check's forward before it (it counts forwards)
    pipe.end_agreement = job["agree"]
    first = pipe.stage_modules().get(0)  # stage 0's FailsLast, on the rank that holds it
    x, y = models.make_batch(pipe.info.stages, 8, seed=0)
    seen = []
    for index in range(job.get("steps", 3)):
        if first is not None:
            first.armed, first.calls = pipe.info.microbatches if index == 1 else 0, 0
        seen.append(timed_step(pipe, x, y))
    return seen
