"""Local search: incremental timing equals a full run, moves keep validity, results never worse."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeforge.ir import CostModel, Placement
from pipeforge.optimizer.evaluate import Graph, Problem, evaluate, is_complete, simulate_order
from pipeforge.optimizer.local import _Searcher, local_search, relocate
from tests.optimize.opt_instances import costs_strategy, one_f_one_b, random_programs, split_work


def problem(p, m, limit, costs=CostModel()):
    return Problem(p, p, m, (Placement.loop(p, p),), costs, limit, 0.5)


@pytest.mark.parametrize(("sequence", "p", "q", "expected"), [
    ((1, 2, 3, 4), 0, 2, (2, 3, 1, 4)),
    ((1, 2, 3, 4), 3, 0, (4, 1, 2, 3)),
    ((1, 2, 3, 4), 1, 2, (1, 3, 2, 4)),
    ((1, 2), 1, 1, (1, 2)),
])
def test_relocate(sequence, p, q, expected):
    assert relocate(sequence, p, q) == expected


@settings(max_examples=30, deadline=None)
@given(p=st.integers(1, 4), m=st.integers(1, 5), costs=costs_strategy, seed=st.integers(0, 10**6))
def test_incremental_timing_equals_a_full_run(p, m, costs, seed):
    graph = Graph(problem(p, m, None, costs), split_work(p, m))
    order = tuple(graph.ids(a) for a in random_programs(p, graph.actions, seed))
    searcher = _Searcher(graph, order, window=4, deadline=float("inf"), progress=None)
    rng = random.Random(seed)
    for _ in range(20):
        r = rng.randrange(p)
        n = len(order[r])
        i, j = rng.randrange(n), rng.randrange(n)
        candidate = order[:r] + (relocate(order[r], i, j),) + order[r + 1:]
        full = simulate_order(graph, candidate)
        resumed = simulate_order(graph, candidate, (searcher.timing, searcher.kept_before(r, min(i, j))))
        assert (full is None) == (resumed is None)
        if full is not None:
            assert resumed.start == pytest.approx(full.start)
            assert resumed.end == pytest.approx(full.end)


@settings(max_examples=25, deadline=None)
@given(p=st.integers(1, 4), m=st.integers(1, 5), costs=costs_strategy, seed=st.integers(0, 10**6),
       limit=st.sampled_from([None, 2.0, 3.0, 4.0]))
def test_local_search_never_worse_and_always_valid(p, m, costs, seed, limit):
    graph = Graph(problem(p, m, limit, costs), split_work(p, m))
    order = tuple(graph.ids(a) for a in random_programs(p, graph.actions, seed))
    start = evaluate(graph, order)
    if not start.fits(limit):
        return
    found = local_search(graph, order, time_limit=2.0, window=4, kicks=2)
    assert is_complete(graph, found.order)
    again = evaluate(graph, found.order)
    assert again is not None and again.fits(limit)
    assert again.key() <= start.key()
    assert found.evaluation == again


def test_local_search_moves_w_into_the_bubbles_of_split_1f1b():
    graph = Graph(problem(4, 8, 4.0), split_work(4, 8))
    order = tuple(graph.ids(a) for a in one_f_one_b(4, 8, split=True))
    before = evaluate(graph, order)
    found = local_search(graph, order, time_limit=20.0, kicks=5)
    assert before.bubble_rate == pytest.approx(1 - 24 / 30)  # the critical path runs through I only
    assert found.evaluation.bubble_rate < before.bubble_rate - 0.05
    assert found.moves > 0


def test_local_search_stops_at_the_target():
    graph = Graph(problem(3, 4, None), split_work(3, 4))
    order = tuple(graph.ids(a) for a in one_f_one_b(3, 4, split=True))
    start = evaluate(graph, order)
    plain = local_search(graph, order, time_limit=20.0, kicks=0)
    found = local_search(graph, order, time_limit=20.0, kicks=1000, target=start.max_span)
    assert (found.order, found.sweeps) == (plain.order, plain.sweeps)
    assert found.evaluation.key() <= start.key()
