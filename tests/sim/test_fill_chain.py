"""The fill chain (pipeforge.sim.bounds.fill_chain): never above what a schedule achieves, binding at the 2p limits."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeforge.ir import CostModel, Placement
from pipeforge.optimizer.evaluate import Graph, Problem, evaluate
from pipeforge.optimizer.exact import solve_exact
from pipeforge.optimizer.greedy import best_zero_bubble_order
from pipeforge.optimizer.list_schedule import list_schedule_orders
from pipeforge.sim.bounds import busy_per_rank, fill_chain_span, work_bound
from tests.optimize.opt_instances import (
    brute_force_best_span, fused_work, per_stage_costs, random_programs, split_work,
)


def loop_graph(p: int, m: int, limit: float | None, costs: CostModel, weights: float = 0.5, fused: bool = False):
    problem = Problem(p, p, m, (Placement.loop(p, p),), costs, limit, weights)
    return Graph(problem, fused_work(p, m) if fused else split_work(p, m))


def fill(graph: Graph, limit: float | None) -> float:
    return fill_chain_span(graph, limit, busy_per_rank(graph))


def best_listed(graph: Graph, limit: float):
    orders = [tuple(graph.ids(keys) for keys in found) for _, found in list_schedule_orders(graph.problem)]
    return min((o for o in orders if evaluate(graph, o).fits(limit)), key=lambda o: evaluate(graph, o).key())


def test_the_fill_chain_binds_at_2p_with_the_papers_costs():
    # 1.5B, p = 8, m = 32, 2p: no rank can fill its wait for its first I with F alone (I + 2c > F: each
    # would need three F more than the rank after it, 22 on rank 0 where 16 fit), so some rank idles;
    # the least worst idle is 3 (I + 2c - F). The other arguments say only busy time there.
    costs = CostModel(F=18.513, I=18.086, W=9.331, comm=0.626)
    graph = loop_graph(8, 32, 16.0, costs, weights=0.366)
    bound = work_bound(graph, 16.0)
    busy = 32 * (costs.F + costs.I + costs.W)
    assert max(r.span for r in bound.ranks) == pytest.approx(busy)
    assert bound.binding is None and bound.argument == "fill chain"
    assert bound.to_json()["argument"] == "fill chain" and bound.to_json()["rank"] is None
    assert bound.binding_text == "all ranks: fill chain" and bound.to_json()["fill_chain"] == bound.max_span
    assert bound.max_span == pytest.approx(busy + 3 * (costs.I + 2 * costs.comm - costs.F))
    assert bound.bubble_rate == pytest.approx(0.00168, abs=5e-6)
    greedy = evaluate(graph, tuple(graph.ids(keys) for keys in best_zero_bubble_order(graph.problem).keys))
    assert bound.max_span <= greedy.max_span + 1e-9


@pytest.mark.parametrize(("p", "m", "limit", "costs", "optimum"), [
    (3, 3, 4.0, CostModel(F=3, I=2, W=4, comm=1, per_stage=((1, "F", 4), (1, "I", 4))), 39.0),
    (3, 3, 6.0, CostModel(F=2, I=1, W=2, comm=0, per_stage=((0, "W", 4), (1, "F", 4), (1, "I", 2), (1, "W", 2),
                                                            (2, "W", 4))), 28.0),
    (3, 3, 6.0, CostModel(F=3, I=4, W=5, comm=0, per_stage=((0, "I", 5), (0, "W", 3), (1, "F", 5), (1, "W", 5))), 45.0),
])
def test_the_fill_chain_never_exceeds_the_exact_optimum(p, m, limit, costs, optimum):
    # Instances where the fill chain says more than every per-rank argument; z3 proves the optimum.
    graph = loop_graph(p, m, limit, costs)
    bound = work_bound(graph, limit)
    others = max(r.span for r in bound.ranks)
    assert bound.fill > others + 1e-9 and bound.argument == "fill chain"
    result = solve_exact(graph, best_listed(graph, limit), others, time_limit=60)
    assert result.optimal and result.upper_bound == pytest.approx(optimum)
    assert bound.fill <= result.upper_bound + 1e-9


def test_the_fill_chain_proves_an_order_optimal_where_exact_search_does_not():
    # p = 3, m = 6, 2p: the per-rank arguments say 80, the fill chain 81, which list scheduling reaches
    # (z3 had not closed [80, 81] after 240 s).
    graph = loop_graph(3, 6, 6.0, CostModel(F=4, I=5, W=4, comm=1))
    bound = work_bound(graph, 6.0)
    assert max(r.span for r in bound.ranks) == pytest.approx(80.0)
    assert bound.max_span == pytest.approx(81.0)
    assert evaluate(graph, best_listed(graph, 6.0)).max_span == pytest.approx(81.0)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(p=st.integers(1, 4), m=st.integers(1, 7), data=st.data(), seed=st.integers(0, 10**6),
       weights=st.sampled_from([0.0, 0.366, 0.5, 1.0]), slack=st.sampled_from([0.0, 0.5, 2.0]),
       fused=st.booleans())
def test_the_fill_chain_holds_for_random_orders(p, m, data, seed, weights, slack, fused):
    # Any order that runs, at its own peak memory (and a little above), split or fused work.
    graph = loop_graph(p, m, None, data.draw(per_stage_costs(p)), weights, fused)
    programs = random_programs(p, list(graph.actions), seed)
    evaluation = evaluate(graph, tuple(graph.ids(program) for program in programs))
    limit = max(evaluation.peak_memory) + slack
    assert fill(graph, limit) <= evaluation.max_span + 1e-9
    assert work_bound(graph, limit).max_span <= evaluation.max_span + 1e-9


@settings(max_examples=15, deadline=None)
@given(p=st.integers(1, 3), m=st.integers(1, 2), data=st.data(), limit=st.sampled_from([None, 1.0, 2.0, 3.0]))
def test_the_fill_chain_never_exceeds_the_brute_force_optimum(p, m, data, limit):
    graph = loop_graph(p, m, limit, data.draw(per_stage_costs(p)))
    brute = brute_force_best_span(graph.problem)
    assert brute is not None
    assert fill(graph, limit) <= brute + 1e-9


@pytest.mark.parametrize("factor", [1e-3, 7.0, 1000.0])
def test_the_fill_chain_does_not_depend_on_the_units(factor):
    costs = CostModel(F=18.513, I=18.086, W=9.331, comm=0.626)
    scaled = CostModel(F=costs.F * factor, I=costs.I * factor, W=costs.W * factor, comm=costs.comm * factor)
    at = fill(loop_graph(8, 32, 16.0, costs, 0.366), 16.0)
    assert fill(loop_graph(8, 32, 16.0, scaled, 0.366), 16.0) == pytest.approx(at * factor, rel=1e-12)


def test_the_fill_chain_says_nothing_beyond_one_stage_a_rank():
    stages = 4
    problem = Problem(2, stages, 2, (Placement.v(stages, 2),), CostModel(F=2, I=1, W=1, comm=1), 2.0, 0.5)
    graph = Graph(problem, split_work(stages, 2))
    assert fill(graph, 2.0) == 0.0
    partial = Graph(Problem(2, 2, 2, (Placement.loop(2, 2),), CostModel(), None, 0.5), split_work(2, 2)[:-3])
    assert fill(partial, None) == 0.0
