"""What the jobs of two hand-written stages share (a head sending a hidden state and a table, a tail).

``two_stage_pipeline(job, rank, head, tail)`` is rank ``rank``'s copy of its stage (0: ``head``,
1: ``tail``), its pipeline of the generated module ``job["path"]`` and a float64 batch and target;
``compared_step`` steps it and reports the error, or the largest difference of this rank's
gradients from the unpipelined model's (``reference``), in ``report``.
"""

from __future__ import annotations

import copy

import torch

from pipeforge.runtime import PipelineError
from pipeforge.tools.generated import load_module

ROWS, WIDTH, MICROBATCHES = 8, 4, 4


def loss_fn(output, target):
    return torch.nn.functional.mse_loss(output, target)


def reference(head: torch.nn.Module, tail: torch.nn.Module, x, y) -> list[torch.Tensor]:
    """The unpipelined gradients of one step: the microbatches' mean loss."""
    for module in (head, tail):
        module.zero_grad(set_to_none=True)
    total = sum(loss_fn(tail(*head(xm)), ym) for xm, ym in zip(x.tensor_split(MICROBATCHES),
                                                            y.tensor_split(MICROBATCHES)))
    (total / MICROBATCHES).backward()
    return [p.grad.clone() for m in (head, tail) for p in m.parameters()]


def two_stage_pipeline(job: dict, rank: int, head: torch.nn.Module, tail: torch.nn.Module):
    """(this rank's copy of its stage, its pipeline, the batch, the target): made after ``head`` and
    ``tail``, which the caller builds under ``torch.manual_seed(0)`` in float64."""
    mine = copy.deepcopy(head if rank == 0 else tail)
    generated = load_module(job["path"])
    pipe = generated.make_pipeline({rank: mine}, loss_fn=loss_fn, timeout=job["wait"])
    x, y = torch.randn(ROWS, WIDTH), torch.randn(ROWS, WIDTH)
    return mine, pipe, x, y


def compared_step(pipe, mine: torch.nn.Module, rank: int, head, tail, x, y, report: dict) -> None:
    """One step (rank 0 gives the batch, rank 1 the target): its error, or "", to ``report["errors"]``;
    where it returned, the largest difference of this rank's gradients from the unpipelined model's
    to ``report["diffs"]``."""
    mine.zero_grad(set_to_none=True)
    try:
        pipe.step(*((x,) if rank == 0 else ()), target=y if rank == 1 else None)
    except PipelineError as error:
        report["errors"].append(str(error))
        return
    report["errors"].append("")
    expected = reference(head, tail, x, y)
    ours = [p.grad for p in mine.parameters()]
    theirs = expected[:len(ours)] if rank == 0 else expected[-len(ours):]
    report["diffs"].append(max((a - b).abs().max().item() for a, b in zip(ours, theirs)))
