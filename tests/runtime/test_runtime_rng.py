"""``pipeforge.runtime.rng``: one seed per (seed, step, stage, microbatch), the caller's RNG left alone."""

from __future__ import annotations

import itertools

import pytest
import torch

from pipeforge.runtime import microbatch_rng, microbatch_seed


def test_every_part_changes_the_seed():
    seeds = {microbatch_seed(*parts) for parts in itertools.product(range(3), repeat=4)}
    assert len(seeds) == 3 ** 4
    assert all(0 <= s < 2 ** 63 for s in seeds)
    assert microbatch_seed(1, 2, 3, 4) == microbatch_seed(1, 2, 3, 4)


def test_the_same_draws_inside_and_the_callers_rng_untouched():
    torch.manual_seed(5)
    before = torch.get_rng_state()
    with microbatch_rng(7, 0, 1, 2):
        first = torch.rand(4)
    assert torch.equal(torch.get_rng_state(), before)
    with microbatch_rng(7, 0, 1, 2):
        assert torch.equal(torch.rand(4), first)
    with microbatch_rng(7, 0, 1, 3):
        assert not torch.equal(torch.rand(4), first)


@pytest.mark.parametrize("bad", [1.5, "1", True, None])
def test_only_integers(bad):
    with pytest.raises(TypeError, match="integers"):
        microbatch_seed(bad, 0, 0, 0)
