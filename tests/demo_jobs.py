"""What the spawned jobs of the runtime tests share: the demo MLP's pipeline on one rank, and a step of it.

``demo_pipeline(job, rank)`` is the pipeline of the generated module ``job["path"]`` on ``rank``
over the demo MLP's stages (float64, seed 0), ``job["wait"]`` its timeout; ``step_batch``
steps (or evaluates) it on a batch and target, each rank passing what it holds;
``timed_step`` tells what a step raised ('' where it returned) and the seconds it took;
``RaisesInBackward`` is the identity whose backward raises, for a failure inside ``step()``;
``gradient_difference`` compares this rank's gradients with the unpipelined model's.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from pipeforge.runtime import Pipeline, PipelineError
from pipeforge.tools import demo_models as models
from pipeforge.tools.generated import load_module


def demo_pipeline(job: Mapping[str, Any], rank: int,
                  wrap: Callable[[int, torch.nn.Module], torch.nn.Module] | None = None) -> Pipeline:
    """``rank``'s pipeline of ``job["path"]`` on the demo MLP (seed 0), ``wrap(stage, module)`` given
    in place of each of its stage modules where ``wrap`` is given; its schedule is ``pipe.info``."""
    generated = load_module(job["path"])
    info = generated.SCHEDULE
    full = models.build_stages("mlp", info.stages, seed=0)
    mine = {s: wrap(s, full[s]) if wrap else full[s] for s in info.stages_of(rank)}
    return generated.make_pipeline(mine, loss_fn=models.loss_fn, timeout=job["wait"])


def step_batch(pipe: Pipeline, x: torch.Tensor, y: torch.Tensor, *, training: bool = True, **options: Any) -> Any:
    """``pipe.step`` (``pipe.eval`` where not ``training``) on batch ``x`` and target ``y``: the first
    stage's rank passes the batch, the last stage's the target."""
    call = pipe.step if training else pipe.eval
    return call(*((x,) if pipe.holds_first else ()), target=y if pipe.holds_last else None, **options)


def timed_step(pipe: Pipeline, x: torch.Tensor, y: torch.Tensor) -> tuple[str, float]:
    """One ``step_batch``: what it raised on this rank ('' where it returned) and the seconds it took."""
    started = time.monotonic()
    try:
        step_batch(pipe, x, y)
    except PipelineError as error:
        return str(error), time.monotonic() - started
    return "", time.monotonic() - started


class RaisesInBackward(torch.autograd.Function):
    """The identity, whose backward raises ``ValueError("a bad gradient")``."""

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        raise ValueError("a bad gradient")


def gradient_difference(mine: Mapping[int, torch.nn.Module], reference: Sequence[torch.nn.Module], x: torch.Tensor,
                        y: torch.Tensor, microbatches: int) -> float:
    """Trains the unpipelined model ``reference`` (every stage) on ``x`` and ``y`` in ``microbatches``
    microbatches; the largest difference of a gradient of ``mine`` (this rank's stages, after a step of
    the pipeline, which divides by ``microbatches``) from the reference's divided by ``microbatches``."""
    for xm, ym in zip(torch.tensor_split(x, microbatches), torch.tensor_split(y, microbatches)):
        models.loss_fn(models.run_stages(reference, xm), ym).backward()
    return max((got.grad - want.grad / microbatches).abs().max().item()
               for stage, module in mine.items() for got, want in zip(module.parameters(), reference[stage].parameters()))
