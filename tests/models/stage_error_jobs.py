"""Workers for a stage that raises inside ``step()``: every peer is told, then the pipeline steps on.

``fail_then_step(rank, nproc, job)`` builds the demo MLP's stages for the generated
module ``job["path"]`` (float64); on rank ``job["victim"]`` stage ``job["stage"]`` (default:
the victim's number) raises in its forward (``job["kind"] == "F"``) or its backward (any
other kind) of microbatch ``job["mb"]`` during the first step (an ``eval`` with ``job["eval"]``). Every rank reports what that step raised (type, message, the
``PeerStageError``'s fields, when it raised), then takes ``STEPS`` more steps on fresh
batches and reports the largest gradient difference from the unpipelined model trained
on the same batches (one SGD step after each).
"""

from __future__ import annotations

import time

import torch

from pipeforge.runtime import PipelineError
from pipeforge.tools import demo_models as models
from tests.demo_jobs import RaisesInBackward, demo_pipeline, gradient_difference, step_batch

STEPS = 2


class FailsOnce(torch.nn.Module):
    """``inner``, raising in the forward (or backward) of microbatch ``mb`` while ``armed``."""

    def __init__(self, inner: torch.nn.Module, kind: str, mb: int):
        super().__init__()
        self.inner, self.kind, self.mb = inner, kind, mb
        self.armed, self.forwards, self.raised_at = True, 0, None

    def forward(self, x):
        index, self.forwards = self.forwards, self.forwards + 1
        hit = self.armed and index == self.mb
        if hit and self.kind == "F":
            self.raised_at = time.time()
            raise ValueError("a bad batch")
        out = self.inner(x)
        if hit:  # the backward of this microbatch raises
            self.raised_at = time.time()  # overwritten below when the backward runs
            out = RaisesInBackward.apply(out)
            out.register_hook(self._stamp)
        return out

    def _stamp(self, grad):
        self.raised_at = time.time()
        return grad


def fail_then_step(rank: int, nproc: int, job: dict) -> dict:
    victim = rank == job["victim"]
    failing = job.get("stage", job["victim"])
    pipe = demo_pipeline(job, rank, lambda s, m: FailsOnce(m, job["kind"], job["mb"]) if victim and s == failing else m)
    pipe.preflight = False  # the failure is inside step(): no check's forward before it (it counts forwards)
    info, mine = pipe.info, pipe.stage_modules()
    reference = models.build_stages("mlp", info.stages, seed=0)  # the demo pipeline's stages, unpipelined
    report: dict = {"rank": rank}
    x, y = models.make_batch(info.stages, 2 * info.microbatches, seed=100)
    started = time.monotonic()
    try:
        step_batch(pipe, x, y, training=not job.get("eval"))
        report["error"] = None
    except PipelineError as error:
        report.update(caught_at=time.time(), seconds=time.monotonic() - started, type=type(error).__name__,
                      error=str(error), cause=type(error.__cause__).__name__,
                      fields={name: getattr(error, name, None)
                              for name in ("failed_rank", "stage", "microbatch", "action")})
    if victim:
        report["raised_at"] = mine[failing].raised_at
        mine[failing].armed = False
    for module in mine.values():
        module.zero_grad(set_to_none=True)
    worst = 0.0
    for step in range(STEPS):
        x, y = models.make_batch(info.stages, 2 * info.microbatches, seed=step)
        step_batch(pipe, x, y)
        worst = max(worst, gradient_difference(mine, reference, x, y, info.microbatches))
        with torch.no_grad():
            for module in (*mine.values(), *reference):
                scale = 1.0 if module in mine.values() else 1.0 / info.microbatches
                for param in module.parameters():
                    param -= 0.1 * scale * param.grad
                    param.grad = None
    report["max_abs_diff"] = worst
    return report
