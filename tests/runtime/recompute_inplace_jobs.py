"""Spawned workers for tests/runtime/test_runtime_recompute_inplace.py: a stage that changes in place a
tensor it receives without a gradient, under schedules that recompute; gradients against the unpipelined
model in float64."""

from __future__ import annotations

import torch

ROWS, WIDTH, MICROBATCHES = 8, 4, 4


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


def loss_fn(output, target):
    return torch.nn.functional.mse_loss(output, target)


def reference(head: Head, tail: Tail, x, y) -> list[torch.Tensor]:
    """The unpipelined gradients of one step: the microbatches' mean loss."""
    for module in (head, tail):
        module.zero_grad(set_to_none=True)
    total = sum(loss_fn(tail(*head(xm)), ym) for xm, ym in zip(x.tensor_split(MICROBATCHES),
                                                            y.tensor_split(MICROBATCHES)))
    (total / MICROBATCHES).backward()
    return [p.grad.clone() for m in (head, tail) for p in m.parameters()]


def two_steps(rank: int, nproc: int, job: dict) -> dict:
    """Two training steps of the generated module ``job["path"]``: per step the error (or "") and the
    largest difference of this rank's gradients from the unpipelined model's."""
    import copy

    from pipeforge.runtime import PipelineError
    from pipeforge.tools.generated import load_module

    torch.set_default_dtype(torch.float64)
    torch.manual_seed(0)
    head, tail = Head(), Tail(job["how"])
    mine = copy.deepcopy(head if rank == 0 else tail)
    generated = load_module(job["path"])
    pipe = generated.make_pipeline({rank: mine}, loss_fn=loss_fn, timeout=job["wait"])
    x, y = torch.randn(ROWS, WIDTH), torch.randn(ROWS, WIDTH)
    report: dict = {"errors": [], "diffs": []}
    for _ in range(2):
        mine.zero_grad(set_to_none=True)
        try:
            pipe.step(*((x,) if rank == 0 else ()), target=y if rank == 1 else None)
            report["errors"].append("")
        except PipelineError as error:
            report["errors"].append(str(error))
            continue
        expected = reference(head, tail, x, y)
        ours = [p.grad for p in mine.parameters()]
        theirs = expected[:len(ours)] if rank == 0 else expected[-len(ours):]
        report["diffs"].append(max((a - b).abs().max().item() for a, b in zip(ours, theirs)))
    return report
