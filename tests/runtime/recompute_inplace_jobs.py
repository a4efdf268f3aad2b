"""Spawned workers for tests/runtime/test_runtime_recompute_inplace.py: a stage that changes in place a
tensor it receives without a gradient, under schedules that recompute; gradients against the unpipelined
model in float64."""

from __future__ import annotations

import torch

from tests.runtime.table_jobs import WIDTH, compared_step, two_stage_pipeline


class Head(torch.nn.Module):
    """A linear layer, sending on a table made without a gradient (as rotary tables ride along)."""

    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(WIDTH, WIDTH)
        self.register_buffer("fixed", torch.tensor(0.5))

    def forward(self, x):
        h = self.linear(x)
        return h, torch.ones_like(h.detach()) * self.fixed - 0.25 * x.detach()


class Tail(torch.nn.Module):
    """Changes the received table in place (``how``: ``clamp_`` or ``add_``) before using it."""

    def __init__(self, how: str):
        super().__init__()
        self.linear = torch.nn.Linear(WIDTH, WIDTH)
        self.how = how

    def forward(self, h, table):
        if self.how == "clamp_":
            table.clamp_(min=0.0)
        else:
            table.add_(1.0)
        return torch.tanh(self.linear(h)) * table


def two_steps(rank: int, nproc: int, job: dict) -> dict:
    """Two training steps of the generated module ``job["path"]``: per step the error (or "") and the
    largest difference of this rank's gradients from the unpipelined model's."""
    torch.set_default_dtype(torch.float64)
    torch.manual_seed(0)
    head, tail = Head(), Tail(job["how"])
    mine, pipe, x, y = two_stage_pipeline(job, rank, head, tail)
    report: dict = {"errors": [], "diffs": []}
    for _ in range(2):
        compared_step(pipe, mine, rank, head, tail, x, y, report)
    return report
