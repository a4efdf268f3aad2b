"""The chunk chain (pipeforge.sim.bounds.chunk_chain): never above what a valid order achieves, what it proves."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeforge.ir import Action, ActionKind, CostModel
from pipeforge.optimizer.evaluate import Graph, evaluate
from pipeforge.optimizer.exact import solve_exact
from pipeforge.sim.bounds import ARGUMENTS, rank_spans, span_lower_bound, work_bound
from pipeforge.sim.bounds.chunk_chain import chunk_chain_spans
from tests.optimize.opt_instances import per_stage_costs
from tests.optimize.test_optimize_bounds import chunked_graph, loop_problem
from tests.sim.chunk_orders import fitting_order

SHAPES = st.sampled_from(["v", "interleaved"])
LIMITS = st.sampled_from([2.0, 2.4, 2.5, 3.0, 3.7, 4.0, 6.0])


def test_a_v_rank_at_half_p_holds_one_microbatch_at_a_time():
    # p = 2, m = 2, limit 2: rank 0 holds stages 0 and 3. A microbatch fills the rank from its F(3) to its
    # I(3), so the second F(0) waits until the first's F(3), I(3) and W(3) are done (52), and its F(3)
    # until the first's I(0) and W(0) are (81); I(0) ends a round trip later: 81 + 47, its W at 133.
    costs = CostModel(F=9, I=9, W=5, comm=1)
    graph = chunked_graph("v", 2, 2, 2.0, costs, weights=0.4)
    down = 3 * costs.F + 2 * costs.comm                    # F(0) start to F(3) start
    back = costs.F + 4 * costs.I + 2 * costs.comm          # F(3) start to I(0) end
    second = down + costs.F + costs.I + costs.W            # the second F(0)
    expected = max(second + down, down + back + costs.W) + back + costs.W
    assert expected == 133.0
    assert chunk_chain_spans(graph, 2.0, _paths(graph))[0] == pytest.approx(expected)
    bound = work_bound(graph, 2.0)
    assert bound.max_span == pytest.approx(expected) and bound.binding.argument == "chunk chain"
    assert bound.to_json()["ranks"][0]["chunk_chain"] == pytest.approx(expected)
    assert "chunk chain" in ARGUMENTS and bound.to_json()["argument"] == "chunk chain"


def test_it_says_nothing_without_a_limit_or_with_one_stage_a_rank():
    costs = CostModel(F=2, I=2, W=1, comm=0.5)
    graph = chunked_graph("v", 3, 4, None, costs)
    assert chunk_chain_spans(graph, None, _paths(graph)) == [0.0, 0.0, 0.0]
    loop = Graph(loop_problem(3, 4, 2.0, costs), [Action(s, k, mb) for s in range(3) for mb in range(4)
                                                  for k in (ActionKind.F, ActionKind.I, ActionKind.W)])
    assert chunk_chain_spans(loop, 2.0, _paths(loop)) == [0.0, 0.0, 0.0]


def test_a_v_at_zb_v_memory_is_not_lifted():
    # At p (ZB-V's 1p, 2p chunk units) a round trip per 2p microbatches is far less than their work.
    costs = CostModel(F=18.522 / 2, I=18.086 / 2, W=9.337 / 2, comm=0.601)
    graph = chunked_graph("v", 8, 24, 16.0, costs, weights=0.366)
    spans = rank_spans(graph, 16.0)
    assert all(r.chunks <= r.busy + 1e-9 and r.argument != "chunk chain" for r in spans)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(shape=SHAPES, p=st.integers(2, 3), m=st.integers(1, 5), limit=LIMITS, data=st.data(),
       weights=st.sampled_from([0.0, 0.366, 0.5, 1.0]), seed=st.integers(0, 10**6))
def test_no_rank_is_proved_above_its_span_in_any_order_that_fits(shape, p, m, limit, data, weights, seed):
    graph = chunked_graph(shape, p, m, limit, data.draw(per_stage_costs(2 * p)), weights)
    order = fitting_order(graph, limit, seed)
    if order is None:
        return  # one microbatch does not fit
    evaluation = evaluate(graph, order)
    for proved in rank_spans(graph, limit):
        assert proved.chunks <= evaluation.spans[proved.rank] + 1e-9


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(shape=SHAPES, limit=st.sampled_from([2.0, 2.5, 3.0, 4.0]), seed=st.integers(0, 10**6),
       costs=st.builds(lambda f, i, w, c: CostModel(F=f, I=i, W=w, comm=c), st.sampled_from([1, 2, 3, 9]),
                       st.sampled_from([1, 2, 3, 9]), st.sampled_from([1, 2, 5]), st.sampled_from([0, 1])),
       weights=st.sampled_from([0.0, 0.4, 0.5]))
def test_the_bound_never_exceeds_the_exact_optimum(shape, limit, seed, costs, weights):
    # p = 2, m = 2: z3 settles these in well under a second; it starts from the bound without the chunk
    # chain, so a chunk chain above the optimum would show.
    graph = chunked_graph(shape, 2, 2, limit, costs, weights)
    start = fitting_order(graph, limit, seed)
    assert start is not None
    spans = rank_spans(graph, limit)
    without = max(max(r.busy, r.round_trip, r.through, r.chain) for r in spans)
    result = solve_exact(graph, start, without, time_limit=30)
    assert result.optimal
    assert span_lower_bound(graph, limit) <= result.upper_bound + 1e-9


@pytest.mark.parametrize(("shape", "p", "m", "limit", "costs", "weights", "before", "optimum"), [
    ("v", 3, 2, 2.0, CostModel(F=9, I=3, W=5, comm=0), 0.4, 106.0, 139.0),
    ("v", 2, 2, 2.5, CostModel(F=9, I=3, W=2, comm=1), 0.5, 77.0, 95.0),
    ("interleaved", 2, 3, 2.5, CostModel(F=3, I=1, W=1, comm=0), 0.5, 38.0, 45.0),
])
def test_where_one_microbatch_fills_a_rank_the_chunk_chain_reaches_the_optimum(shape, p, m, limit, costs, weights,
                                                                              before, optimum):
    graph = chunked_graph(shape, p, m, limit, costs, weights)
    spans = rank_spans(graph, limit)
    assert max(max(r.busy, r.round_trip, r.through, r.chain) for r in spans) == pytest.approx(before)
    assert span_lower_bound(graph, limit) == pytest.approx(optimum)
    start = fitting_order(graph, limit, 0)
    result = solve_exact(graph, start, before, time_limit=30)
    assert result.optimal and result.upper_bound == pytest.approx(optimum)


def _paths(graph):
    from pipeforge.sim.bounds.paths import Paths

    return Paths(graph)


@pytest.mark.slow  # z3 on p = 2, 3 and m = 2, 3 at several limits: a minute or two
@pytest.mark.parametrize("shape", ["v", "interleaved"])
def test_the_bound_never_exceeds_what_exact_search_finds_at_p_2_and_3(shape):
    # The bound must be at most every valid order's span; exact search (from the bound without the chunk
    # chain) finds the optimum or a good order within its time.
    costs = [CostModel(F=9, I=9, W=5, comm=1), CostModel(F=3, I=1, W=2, comm=0), CostModel(F=1, I=9, W=1, comm=1)]
    lifted = 0
    for p, m in ((2, 2), (2, 3), (3, 2), (3, 3)):
        for limit in (2.0, 2.5, 3.0, 4.0):
            for k, cost in enumerate(costs):
                graph = chunked_graph(shape, p, m, limit, cost, weights=0.4)
                spans = rank_spans(graph, limit)
                without = max(max(r.busy, r.round_trip, r.through, r.chain) for r in spans)
                result = solve_exact(graph, fitting_order(graph, limit, k), without, time_limit=3)
                assert max(r.span for r in spans) <= result.upper_bound + 1e-9
                lifted += max(r.span for r in spans) > without + 1e-9
    assert lifted > 0
