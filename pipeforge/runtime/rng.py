"""Dropout's masks per (step, stage, microbatch): the same in a pipeline and in unpipelined training.

``make_pipeline(rng_seed=S)`` runs the forward of stage s on microbatch m in the pipeline's k-th
``step()`` (its loss included) under ``microbatch_rng(S, k, s, m)``: torch's RNG (the CPU generator, and
the device's CUDA generator) seeded with ``microbatch_seed(S, k, s, m)`` in a fork, so the caller's RNG
is left as it was and no forward's draws depend on the order a schedule runs them in. Unpipelined
training that runs each stage's forward under the same context draws the same masks. A recompute (R)
restores the state its forward started from, so it draws them again. Contract: ``docs/runtime.md``.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

_MASK = (1 << 64) - 1


def _mix(value: int) -> int:
    """splitmix64's finalizer: every bit of ``value`` moves every bit of the result."""
    value = (value + 0x9E3779B97F4A7C15) & _MASK
    value = ((value ^ (value >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    value = ((value ^ (value >> 27)) * 0x94D049BB133111EB) & _MASK
    return value ^ (value >> 31)


def microbatch_seed(seed: int, step: int, stage: int, microbatch: int) -> int:
    """The seed of one forward: a 63-bit number that differs for every (seed, step, stage, microbatch)."""
    for part in (seed, step, stage, microbatch):
        if not isinstance(part, int) or isinstance(part, bool):
            raise TypeError(f"microbatch_seed takes integers, got {part!r}")
    value = 0
    for part in (seed, step, stage, microbatch):
        value = _mix(value ^ (part & _MASK))
    return value >> 1


@contextmanager
def microbatch_rng(seed: int, step: int, stage: int, microbatch: int,
                   device: torch.device | str | None = None) -> Iterator[None]:
    """Run the body with torch's RNG seeded for one forward (``microbatch_seed``), restored afterwards.

    ``device``: a CUDA device whose generator is seeded (and restored) too; the CPU's always is."""
    device = torch.device(device) if device is not None else None
    cuda = device is not None and device.type == "cuda"
    value = microbatch_seed(seed, step, stage, microbatch)
    with torch.random.fork_rng(devices=[device] if cuda else [], enabled=True):
        torch.default_generator.manual_seed(value)
        if cuda:
            with torch.cuda.device(device):
                torch.cuda.manual_seed(value)
        yield


class StepRng:
    """One step's seeding: ``forward(stage, microbatch)`` is the context its forward runs in."""

    __slots__ = ("device", "seed", "step")

    def __init__(self, seed: int, step: int, device: torch.device | None):
        self.seed, self.step, self.device = seed, step, device

    def forward(self, stage: int, microbatch: int):
        return microbatch_rng(self.seed, self.step, stage, microbatch, self.device)


__all__ = ["StepRng", "microbatch_rng", "microbatch_seed"]
