"""``gradients.divide``: the step's gradients divided by the microbatch count bit for bit as ``div_`` divides
them by the number, in every floating dtype, shape (0-dimensional and empty included) and count."""

from __future__ import annotations

import pytest
import torch

from pipeforge.runtime.gradients import FEW_GRADIENTS, divide

DTYPES = [torch.float64, torch.float32, torch.bfloat16, torch.float16, torch.complex64]
DIVISORS = [1, 3, 7, 8, 257, 4097, 65537, 2**24 + 1, 3**20]
SHAPES = [(), (1,), (7,), (64, 4), (2, 0)]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("count", [2, FEW_GRADIENTS + 1], ids=["few", "many"])
def test_divide_is_div_by_the_number(dtype, count):
    generator = torch.Generator().manual_seed(0)
    for divisor in DIVISORS:
        grads = [(torch.randn(SHAPES[i % len(SHAPES)], generator=generator, dtype=torch.float64) * 1e3).to(dtype)
                 for i in range(count)]
        want = [g.clone().div_(float(divisor)) for g in grads]
        divide(grads, divisor)
        for got, expected in zip(grads, want):
            assert got.dtype == dtype and torch.equal(got, expected), (dtype, divisor, tuple(got.shape))
