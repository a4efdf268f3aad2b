"""The shared partition against brute force over every set of cut points."""

from __future__ import annotations

from itertools import combinations_with_replacement

from hypothesis import given
from hypothesis import strategies as st

from pipeforge.partition import least_max_edges


def _costliest(weights, edges, first, last):
    blocks = len(edges) - 1
    return max(sum(weights[edges[s]:edges[s + 1]]) + (first if s == 0 else 0.0) + (last if s == blocks - 1 else 0.0)
               for s in range(blocks))


def _least_by_brute_force(weights, blocks, first, last, at_least):
    best = float("inf")
    for inner in combinations_with_replacement(range(len(weights) + 1), blocks - 1):
        edges = [0, *inner, len(weights)]
        if all(edges[s + 1] - edges[s] >= at_least for s in range(blocks)):
            best = min(best, _costliest(weights, edges, first, last))
    return best


@given(weights=st.lists(st.integers(0, 20), min_size=1, max_size=7), blocks=st.integers(1, 4),
       first=st.integers(0, 30), last=st.integers(0, 30), at_least=st.integers(0, 1))
def test_the_partition_is_a_cheapest_one(weights, blocks, first, last, at_least):
    if blocks * at_least > len(weights):
        return
    edges = least_max_edges(weights, blocks, first, last, at_least)
    assert edges[0] == 0 and edges[-1] == len(weights) and len(edges) == blocks + 1
    assert all(edges[s + 1] - edges[s] >= at_least for s in range(blocks))
    assert _costliest(weights, edges, first, last) == _least_by_brute_force(weights, blocks, first, last, at_least)


def test_heavy_ends_push_the_layers_inward():
    assert least_max_edges([1.0] * 8, 2, first=4.0, last=0.0, at_least=1) == [0, 2, 8]
    assert least_max_edges([1.0] * 4, 3, at_least=0) == [0, 1, 2, 4]
