"""``split_backward.ScalarSeed``: a loss's backward with the seed made once accumulates what
``loss.backward()`` accumulates, and a seed that no longer fits (written into, another dtype or number
of dimensions) is made again, never given to the engine."""

from __future__ import annotations

import pytest
import torch

from pipeforge.runtime.split_backward import ScalarSeed


def _losses(weight: torch.Tensor, shapes: list[tuple[int, ...]], dtypes: list[torch.dtype]) -> list[torch.Tensor]:
    return [(weight.to(dtype) * (i + 1)).sum().reshape(shape) for i, (shape, dtype) in enumerate(zip(shapes, dtypes))]


CHANGES = {
    "same": ([()] * 4, [torch.float64] * 4),
    "dims": ([(), (1,), (1, 1), ()], [torch.float64] * 4),
    "dtypes": ([()] * 4, [torch.float64, torch.float32, torch.float32, torch.float64]),
}


@pytest.mark.parametrize("change", sorted(CHANGES))
def test_seeded_backward_accumulates_as_backward(change):
    shapes, dtypes = CHANGES[change]
    ours = torch.linspace(-1, 1, 5, dtype=torch.float64).requires_grad_()
    theirs = ours.detach().clone().requires_grad_()
    seed = ScalarSeed()
    for mine, reference in zip(_losses(ours, shapes, dtypes), _losses(theirs, shapes, dtypes)):
        seed.backward(mine)
        reference.backward()
        assert torch.equal(ours.grad, theirs.grad), change
        assert seed.tensor is not None and seed.tensor.dtype == mine.dtype and seed.tensor.dim() == mine.dim()


def test_a_seed_written_into_is_made_again():
    weight = torch.ones(3, dtype=torch.float64, requires_grad=True)
    seed = ScalarSeed()
    seed.backward(weight.sum())
    first = seed.tensor
    assert first is not None
    first.mul_(5)  # what a gradient hook writing in place would leave
    seed.backward(weight.sum())
    assert seed.tensor is not first and float(seed.tensor) == 1.0
    assert torch.equal(weight.grad, torch.full((3,), 2.0, dtype=torch.float64))
