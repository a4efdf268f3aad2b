"""Small float64 models split into stages, for ``pipeforge run`` and the tests.

- ``mlp``: stage s is ``Linear(width[s], width[s+1])`` then ``tanh`` (none after
  the last), so the activation's width changes at every stage boundary;
- ``tuple``: every activation is a pair ``(hidden, skip)``: each stage mixes the
  skip into the hidden state and passes the skip on, so tuples cross ranks and
  gradients flow back along both.

Both are deterministic for a seed; the loss is the mean squared error.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from pipeforge.runtime.microbatch import as_tuple

MODELS = ("mlp", "tuple")
SKIP_WIDTH = 5


def widths(stages: int) -> list[int]:
    """Activation widths at the stage boundaries: width[s] enters stage s."""
    return [6 + (7 * s) % 11 for s in range(stages + 1)]


class MlpStage(nn.Module):
    def __init__(self, width_in: int, width_out: int, last: bool):
        super().__init__()
        self.linear = nn.Linear(width_in, width_out)
        self.last = last

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.linear(x)
        return y if self.last else torch.tanh(y)


class TupleStage(nn.Module):
    """``(hidden, skip) -> (tanh(A hidden + B skip), skip)``; stage 0 takes ``x`` and uses it as the skip."""

    def __init__(self, width_in: int, width_out: int, first: bool, last: bool):
        super().__init__()
        self.first, self.last = first, last
        self.hidden = nn.Linear(width_in, width_out)
        self.skip = nn.Linear(width_in if first else SKIP_WIDTH, width_out)
        self.skip_out = nn.Linear(width_in, SKIP_WIDTH) if first else None

    def forward(self, hidden: torch.Tensor, skip: torch.Tensor | None = None) -> Any:
        if self.first:
            skip = hidden
        mixed = self.hidden(hidden) + self.skip(skip)
        if self.last:
            return mixed
        carried = self.skip_out(skip) if self.skip_out is not None else skip  # (made for the first stage only)
        return torch.tanh(mixed), carried


def build_stages(model: str, stages: int, seed: int = 0) -> list[nn.Module]:
    """The model's stages with deterministic float64 parameters."""
    if model not in MODELS:
        raise ValueError(f"unknown model {model!r}; choose one of {', '.join(MODELS)}")
    generator_state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    try:
        w = widths(stages)
        built: list[nn.Module]
        if model == "mlp":
            built = [MlpStage(w[s], w[s + 1], s == stages - 1) for s in range(stages)]
        else:
            built = [TupleStage(w[s], w[s + 1], s == 0, s == stages - 1) for s in range(stages)]
    finally:
        torch.random.set_rng_state(generator_state)
    return [stage.double() for stage in built]


def make_batch(stages: int, rows: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """An input batch and its target, deterministic for ``seed``."""
    generator = torch.Generator().manual_seed(seed)
    w = widths(stages)
    x = torch.randn(rows, w[0], generator=generator, dtype=torch.float64)
    y = torch.randn(rows, w[-1], generator=generator, dtype=torch.float64)
    return x, y


def loss_fn(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return nn.functional.mse_loss(output, target)


def run_stages(stages: list[nn.Module], *inputs: Any) -> Any:
    """The unpipelined model: every stage in order on one process."""
    value: Any = inputs
    for stage in stages:
        value = stage(*as_tuple(value))
    return value
