"""Spawned workers of tests/runtime/test_runtime_inplace.py: stages that change a tensor in place (the batch
at stage 0, a received activation that carries a gradient at a later stage), trained against the
unpipelined model in float64."""

from __future__ import annotations

import copy

import torch

from pipeforge.runtime import PipelineError
from pipeforge.tools.generated import load_module

ROWS, WIDTH = 12, 4


class Changes(torch.nn.Module):
    """``how`` applied in place to its input first (``add_``: plus one; ``relu``: ``ReLU(inplace=True)``;
    ``none``: nothing), then a linear layer; ``mul_``: its input doubled in place, then a bias added (which
    keeps no input for the backward: the batch's microbatches are views of one tensor, whose version a
    later microbatch's change moves on)."""

    def __init__(self, how: str):
        super().__init__()
        self.how, self.linear, self.relu = how, torch.nn.Linear(WIDTH, WIDTH), torch.nn.ReLU(inplace=True)

    def forward(self, x):
        if self.how == "mul_":
            return torch.tanh(x.mul_(2.0) + self.linear.bias)
        if self.how == "add_":
            x.add_(1.0)
        elif self.how == "relu":
            x = self.relu(x)
        return self.linear(x)


def loss_fn(output, target):
    return torch.nn.functional.mse_loss(output, target)


def _reference(stages: list[torch.nn.Module], x: torch.Tensor, y: torch.Tensor, microbatches: int) -> list:
    """One unpipelined step on ``x`` (which the first stage may change, microbatch by microbatch, as the
    pipeline's stage 0 does): every stage's gradients of the microbatches' mean loss."""
    for stage in stages:
        stage.zero_grad(set_to_none=True)
    total = 0
    for xm, ym in zip(x.tensor_split(microbatches), y.tensor_split(microbatches)):
        value = xm
        for stage in stages:
            value = stage(value)
        total = total + loss_fn(value, ym)
    (total / microbatches).backward()
    return [[None if p.grad is None else p.grad.clone() for p in stage.parameters()] for stage in stages]


def compared_steps(rank: int, nproc: int, job: dict) -> dict:
    """``job["steps"]`` steps of the generated module ``job["path"]`` over stages ``Changes(job["hows"][s])``,
    beside the same unpipelined steps: per step the error (or ""), the largest difference of this rank's
    gradients from the unpipelined ones, and on the rank holding stage 0 of its batch (which stage 0 may
    change) from the unpipelined batch. The first step runs the pipeline's check first (``preflight``)."""
    torch.set_default_dtype(torch.float64)
    generated = load_module(job["path"])
    info = generated.SCHEDULE
    torch.manual_seed(0)
    stages = [Changes(how) for how in job["hows"]]
    x, y = torch.randn(ROWS, WIDTH), torch.randn(ROWS, WIDTH)
    mine = {s: copy.deepcopy(stages[s]) for s in info.stages_of(rank)}
    pipe = generated.make_pipeline(mine, loss_fn=loss_fn, timeout=job["wait"])
    ours_x, theirs_x = x.clone(), x.clone()
    report: dict = {"errors": [], "diffs": [], "batch": []}
    for _ in range(job["steps"]):
        for module in mine.values():
            module.zero_grad(set_to_none=True)
        try:
            pipe.step(*((ours_x,) if pipe.holds_first else ()), target=y if pipe.holds_last else None)
            report["errors"].append("")
        except PipelineError as error:
            report["errors"].append(str(error))
        expected = _reference(stages, theirs_x, y, info.microbatches)
        report["diffs"].append(max((a - b).abs().max().item() for s, module in mine.items()
                                   for a, b in zip([p.grad for p in module.parameters()], expected[s])
                                   if b is not None) if not report["errors"][-1] else None)
        if pipe.holds_first:
            report["batch"].append((ours_x - theirs_x).abs().max().item())
    return report
