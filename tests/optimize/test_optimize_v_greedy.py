"""The Zero Bubble V scheduler (v_greedy.py): complete orders that run and fit, the rules of semantics.py."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from pipeforge.ir import Action, ActionKind, CostModel, Placement
from pipeforge.optimizer.evaluate import Graph, Problem, evaluate, is_complete
from pipeforge.optimizer.v_greedy import V_KNOBS, zero_bubble_v_orders
from tests.optimize.opt_instances import per_stage_costs


def v_problem(p, m, limit, costs, weights=0.5):
    return Problem(p, 2 * p, m, (Placement.v(2 * p, p),), costs, limit, weights)


def v_graph(problem):
    stages = problem.stages
    return Graph(problem, [Action(s, k, mb) for s in range(stages) for mb in range(problem.microbatches)
                           for k in (ActionKind.F, ActionKind.I, ActionKind.W)])


@settings(max_examples=30, deadline=None)
@given(p=st.integers(1, 4), m=st.integers(1, 6), data=st.data(), limit=st.sampled_from([None, 2.0, 3.0, 4.0]),
       weights=st.sampled_from([0.5, 0.366]))
def test_every_order_is_complete_runs_and_fits_with_per_stage_costs_and_links(p, m, data, limit, weights):
    costs = data.draw(per_stage_costs(2 * p))
    problem = v_problem(p, m, None if limit is None else limit * p, costs, weights)
    graph = v_graph(problem)
    for _, keys in zero_bubble_v_orders(problem):
        order = tuple(graph.ids(rank) for rank in keys)
        assert is_complete(graph, order)
        evaluation = evaluate(graph, order)
        assert evaluation is not None and evaluation.fits(problem.memory_limit)


def test_links_equal_to_comm_build_the_same_orders_and_a_slow_link_is_waited_for():
    half = CostModel(F=9.261, I=9.043, W=4.6685, comm=0.601)
    linked = CostModel(F=9.261, I=9.043, W=4.6685, comm=0.601, links=(0.601,) * 15)
    problem = v_problem(8, 24, 16.0, half, 0.366)
    plain = zero_bubble_v_orders(problem)
    same = zero_bubble_v_orders(v_problem(8, 24, 16.0, linked, 0.366))
    assert [keys for _, keys in plain] == [keys for _, keys in same]
    assert {knobs for knobs, _ in plain} == set(V_KNOBS)
    # a slow link between the two chunks of the last rank's neighbour changes what the builder waits for
    slow = CostModel(F=9.261, I=9.043, W=4.6685, comm=0.601, links=(0.601,) * 6 + (20.0,) + (0.601,) * 8)
    assert [keys for _, keys in zero_bubble_v_orders(v_problem(8, 24, 16.0, slow, 0.366))] != [k for _, k in plain]
