"""Exact search and the proven bounds against brute-force enumeration of every order."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeforge.ir import Action, ActionKind, CostModel, Placement
from pipeforge.sim.bounds import bubble_lower_bound, busy_per_rank, span_lower_bound
from pipeforge.optimizer.evaluate import Graph, Problem, evaluate
from pipeforge.optimizer.exact import solve_exact
from pipeforge.optimizer.greedy import zero_bubble_orders
from tests.optimize.opt_instances import brute_force_best_span, costs_strategy, one_f_one_b, split_work

ZB_COSTS = CostModel(F=18.522, I=18.086, W=9.337, comm=0.601)


def problem(p, m, limit, costs=CostModel(), weights=0.5):
    return Problem(p, p, m, (Placement.loop(p, p),), costs, limit, weights)


def poor_order(graph):
    """1F1B with B split (no W moved into gaps) when it fits the limit, else the greedy order."""
    order = tuple(graph.ids(a) for a in one_f_one_b(graph.problem.ranks, graph.problem.microbatches, split=True))
    return order if evaluate(graph, order).fits(graph.problem.memory_limit) else greedy_order(graph)


def greedy_order(graph):
    orders = [tuple(graph.ids(a) for a in g.programs) for g in zero_bubble_orders(graph.problem)]
    return min(orders, key=lambda o: evaluate(graph, o).key())


CASES = [
    (2, 2, None, CostModel()),
    (2, 2, 1.0, CostModel()),
    (2, 2, 1.5, CostModel(F=1, I=2, W=1, comm=0.5)),
    (2, 2, 2.0, CostModel(F=2, I=1, W=0.5, comm=1.0)),
    (3, 2, 1.5, CostModel(F=1, I=1, W=1, comm=0.25)),
    (3, 2, None, CostModel(F=1, I=2, W=2, comm=0.0)),
]


@pytest.mark.parametrize(("p", "m", "limit", "costs"), CASES)
def test_exact_proves_the_brute_force_optimum(p, m, limit, costs):
    prob = problem(p, m, limit, costs)
    graph = Graph(prob, split_work(p, m))
    brute = brute_force_best_span(prob)
    # Start from a weak bound (busy time) so the solver has to do the proving.
    result = solve_exact(graph, poor_order(graph), max(busy_per_rank(graph)), time_limit=60)
    assert result.optimal
    assert result.upper_bound == pytest.approx(brute)
    assert evaluate(graph, result.order).max_span == pytest.approx(brute)
    assert result.lower_bound <= brute + 1e-9


@pytest.mark.parametrize(("p", "m", "limit", "costs"), CASES[:4])
def test_exact_without_asap_timing_still_bounds_from_below(p, m, limit, costs):
    prob = problem(p, m, limit, costs)
    graph = Graph(prob, split_work(p, m))
    result = solve_exact(graph, greedy_order(graph), max(busy_per_rank(graph)), time_limit=60, asap=False)
    assert result.lower_bound <= brute_force_best_span(prob) + 1e-9


@settings(max_examples=25, deadline=None)
@given(p=st.integers(1, 3), m=st.integers(1, 2), costs=costs_strategy,
       limit=st.sampled_from([None, 1.0, 1.5, 2.0, 3.0]), weights=st.sampled_from([0.5, 0.25]))
def test_round_trip_bound_never_exceeds_the_optimum(p, m, costs, limit, weights):
    prob = problem(p, m, limit, costs, weights)
    brute = brute_force_best_span(prob)
    assert brute is not None
    assert span_lower_bound(Graph(prob, split_work(p, m)), prob.memory_limit) <= brute + 1e-9


def test_the_bound_proves_zb_1p_optimal_at_p8():
    # Round-trip bound on rank 0 at 1p memory equals the ZB-1p span (Zero Bubble paper, Table 5).
    for m, paper in ((24, 0.1585), (32, 0.1242)):
        prob = problem(8, m, 8.0, ZB_COSTS)
        graph = Graph(prob, split_work(8, m))
        best = evaluate(graph, greedy_order(graph))
        assert bubble_lower_bound(graph, graph.problem.memory_limit) == pytest.approx(best.bubble_rate)
        assert best.bubble_rate <= paper + 5e-5


def test_exact_respects_the_time_limit_and_keeps_a_valid_order():
    prob = problem(4, 6, 2.0, CostModel(comm=0.1))
    graph = Graph(prob, split_work(4, 6))
    start = greedy_order(graph)
    result = solve_exact(graph, start, max(busy_per_rank(graph)), time_limit=1.0)
    evaluation = evaluate(graph, result.order)
    assert evaluation is not None and evaluation.fits(2.0)
    assert result.upper_bound <= evaluate(graph, start).max_span
    assert result.lower_bound <= result.upper_bound


def laid_out(p, m, placement, limit, costs, weights=0.5):
    stages = len(placement.stage_to_rank)
    prob = Problem(p, stages, m, (placement,), costs, limit, weights)
    work = [Action(s, k, mb) for s in range(stages) for mb in range(m) for k in (ActionKind.F, ActionKind.I, ActionKind.W)]
    return Graph(prob, work)


def any_order(graph):
    from pipeforge.optimizer.list_schedule import list_schedule_orders

    orders = [tuple(graph.ids(list(r)) for r in keys) for _, keys in list_schedule_orders(graph.problem)]
    return min((o for o in orders if evaluate(graph, o).fits(graph.problem.memory_limit)),
               key=lambda o: evaluate(graph, o).key())


@settings(max_examples=12, deadline=None)
@given(shape=st.sampled_from(["v", "interleaved"]), m=st.integers(1, 2), costs=costs_strategy,
       limit=st.sampled_from([2.0, 3.0, 4.0]))
def test_the_round_trip_bound_holds_for_v_and_interleaved_placements(shape, m, costs, limit):
    placement = Placement.v(4, 2) if shape == "v" else Placement.loop(4, 2)
    graph = laid_out(2, m, placement, limit, costs)
    result = solve_exact(graph, any_order(graph), max(busy_per_rank(graph)), time_limit=60)
    assert result.optimal
    assert span_lower_bound(graph, graph.problem.memory_limit) <= result.upper_bound + 1e-9


@pytest.mark.parametrize(("placement", "limit"), [(Placement.v(4, 2), 4.0), (Placement.loop(3, 3), 6.0)])
def test_exact_proves_optimality_for_a_v_placement_and_a_2p_limit(placement, limit):
    p = max(placement.stage_to_rank) + 1
    graph = laid_out(p, 2, placement, limit, CostModel(F=1, I=1, W=0.5, comm=0.25))
    result = solve_exact(graph, any_order(graph), span_lower_bound(graph, graph.problem.memory_limit), time_limit=60)
    assert result.optimal and result.lower_bound == pytest.approx(result.upper_bound, rel=1e-6)


def test_the_bound_is_not_just_busy_time_for_v_and_interleaved_at_1p():
    half = CostModel(F=ZB_COSTS.F / 2, I=ZB_COSTS.I / 2, W=ZB_COSTS.W / 2, comm=ZB_COSTS.comm)
    for placement, at_least in ((Placement.v(16, 8), 0.005), (Placement.loop(16, 8), 0.05)):
        graph = laid_out(8, 24, placement, 16.0, half, weights=0.366)
        assert bubble_lower_bound(graph, graph.problem.memory_limit) >= at_least
