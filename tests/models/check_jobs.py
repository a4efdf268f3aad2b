"""Workers for ``Pipeline.check`` and stage errors: small stage modules that go wrong in one way each.

``run_checks(rank, nproc, paths)`` builds, for each case, a pipeline of the
schedule at ``paths[schedule]`` whose stage 1 (or 0) is broken as the case says,
calls ``pipe.check(...)`` with the step's arguments (``run_first_steps``: calls
``pipe.step(...)``, whose first call checks) and reports the message each rank
got (``None`` when the check passed) and how long the call took.
``run_step_error`` lets a module raise inside ``step()`` and reports the error.
"""

from __future__ import annotations

import time

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from pipeforge.runtime import PipelineError
from pipeforge.tools.generated import load_module
from tests.load import scaled

WIDTH = 8


class Block(nn.Module):
    """A linear layer; ``how`` breaks it: returns a dict, ``(h, None)``, wants a mask, takes another width..."""

    def __init__(self, how: str = "fine", width: int = WIDTH):
        super().__init__()
        self.linear = nn.Linear(width, WIDTH)
        self.how = how

    def forward(self, x, *rest):
        if self.how == "needs-mask" and not rest:
            return self.needs_mask(x)
        if self.how == "reentrant":
            return checkpoint(self.linear, x, use_reentrant=True)
        if self.how == "checkpoint":
            return checkpoint(self.linear, x, use_reentrant=False)
        h = torch.tanh(self.linear(x))
        if self.how == "model-output":
            from transformers.modeling_outputs import BaseModelOutput

            return BaseModelOutput(last_hidden_state=h)
        if self.how == "dict":
            return {"hidden": h}
        if self.how == "h-none":
            return h, None
        if self.how == "raises" and not torch.is_grad_enabled():
            return h
        if self.how == "raises" and x.shape[0] > 0 and getattr(self, "armed", False):
            raise ZeroDivisionError("the expert count is zero")
        return h

    def needs_mask(self, x, mask):  # called with one argument: TypeError, missing 'mask'
        return x * mask


CASES = {  # case -> (schedule, the broken stage, how)
    "good": ("1f1b", 1, "fine"),
    "model-output": ("1f1b", 0, "model-output"),
    "dict": ("1f1b", 0, "dict"),
    "h-none": ("1f1b", 0, "h-none"),
    "missing-argument": ("1f1b", 1, "needs-mask"),
    "shape": ("1f1b", 1, "wide"),
    "reentrant-split": ("zb-h1", 1, "reentrant"),
    "reentrant-1f1b": ("1f1b", 1, "reentrant"),
    "checkpoint-split": ("zb-h1", 1, "checkpoint"),
}


def stages_for(how: str, broken: int, stages: int) -> dict[int, nn.Module]:
    torch.manual_seed(0)
    built = {}
    for stage in range(stages):
        mine = how if stage == broken else "fine"
        built[stage] = Block(mine, 2 * WIDTH if mine == "wide" else WIDTH).double()
    return built


def loss_fn(output, target):
    return F.mse_loss(output, target)


def run_checks(rank: int, nproc: int, paths: dict[str, str], call: str = "check") -> dict[str, dict]:
    """``call``: ``"check"`` calls ``pipe.check`` first; ``"step"`` calls ``pipe.step`` alone, whose first
    call runs the same check before any compute."""
    results = {}
    for case, (schedule, broken, how) in CASES.items():
        generated = load_module(paths[schedule])
        info = generated.SCHEDULE
        every = stages_for(how, broken, info.stages)
        pipe = generated.make_pipeline({s: every[s] for s in generated.stages_of_rank(rank)}, loss_fn=loss_fn,
                                       timeout=30)
        x = torch.randn(2 * info.microbatches, WIDTH, dtype=torch.float64)
        started = time.monotonic()
        try:
            run = pipe.check if call == "check" else pipe.step
            run(*((x,) if pipe.holds_first else ()), target=torch.zeros_like(x) if pipe.holds_last else None)
            message = None
        except PipelineError as error:
            message = str(error)
        results[case] = {"message": message, "seconds": time.monotonic() - started}
    return results


def run_first_steps(rank: int, nproc: int, paths: dict[str, str]) -> dict[str, dict]:
    """``run_checks`` with ``step()`` called at once: its first call checks."""
    return run_checks(rank, nproc, paths, "step")


def run_step_error(rank: int, nproc: int, path: str) -> str | None:
    """Stage 1 raises in its forward of microbatch 1; returns what ``step()`` raised on this rank."""
    generated = load_module(path)
    info = generated.SCHEDULE
    every = stages_for("raises", 1, info.stages)
    calls = {"n": 0}

    def arm(module, args):
        calls["n"] += 1
        module.armed = calls["n"] == 2  # the second forward: microbatch 1

    every[1].register_forward_pre_hook(arm)
    pipe = generated.make_pipeline({s: every[s] for s in generated.stages_of_rank(rank)}, loss_fn=loss_fn,
                                   timeout=scaled(5))
    pipe.preflight = False  # the failure is inside step(): no check's forward before it (it counts forwards)
    x = torch.randn(2 * info.microbatches, WIDTH, dtype=torch.float64)
    try:
        pipe.step(*((x,) if pipe.holds_first else ()), target=torch.zeros_like(x) if pipe.holds_last else None)
    except PipelineError as error:
        cause = error.__cause__
        return f"{type(error).__name__}: {error} | cause {type(cause).__name__}"
    return None
