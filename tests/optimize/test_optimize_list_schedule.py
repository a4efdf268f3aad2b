"""List scheduling for any one-chain placement: valid orders, and zero bubble where one exists."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeforge.ir import Action, ActionKind, CostModel, Placement
from pipeforge.optimizer.evaluate import Graph, Problem, evaluate, is_complete
from pipeforge.optimizer.list_schedule import RULES, list_schedule_orders
from tests.optimize.opt_instances import costs_strategy

F, I, W = ActionKind.F, ActionKind.I, ActionKind.W


def graph_of(ranks, placement, m, limit, costs=CostModel()):
    stages = len(placement.stage_to_rank)
    problem = Problem(ranks, stages, m, (placement,), costs, limit, 0.5)
    work = [Action(s, k, mb) for s in range(stages) for mb in range(m) for k in (F, I, W)]
    return Graph(problem, work)


def evaluations(graph):
    out = []
    for _, keys in list_schedule_orders(graph.problem):
        order = tuple(graph.ids(k) for k in keys)
        out.append((order, evaluate(graph, order)))
    return out


def test_eight_rule_combinations():
    assert len(set(RULES)) == 8


@pytest.mark.parametrize(("ranks", "placement", "m", "limit", "bubble"), [
    (4, Placement.loop(4, 4), 8, 4.0, 1 - 24 / 27),  # ZB-H1
    (4, Placement.v(8, 4), 8, 8.0, 0.0),             # ZB-V at unit costs
])
def test_known_results_at_unit_costs(ranks, placement, m, limit, bubble):
    best = min((e for _, e in evaluations(graph_of(ranks, placement, m, limit))), key=lambda e: e.key())
    assert best.bubble_rate == pytest.approx(bubble, abs=1e-9)
    assert max(best.peak_memory) <= limit


@settings(max_examples=30, deadline=None)
@given(ranks=st.integers(1, 4), laps=st.integers(1, 2), shape=st.sampled_from(["loop", "v"]),
       m=st.integers(1, 6), limit=st.sampled_from([None, 2.0, 3.0, 4.0, 8.0]), costs=costs_strategy)
def test_every_order_is_complete_runs_and_fits(ranks, laps, shape, m, limit, costs):
    placement = getattr(Placement, shape)(ranks * laps, ranks)
    graph = graph_of(ranks, placement, m, limit, costs)
    for order, evaluation in evaluations(graph):
        assert is_complete(graph, order)
        assert evaluation is not None and evaluation.fits(limit)


@settings(max_examples=25, deadline=None)
@given(ranks=st.integers(1, 4), laps=st.integers(1, 2), shape=st.sampled_from(["loop", "v"]),
       m=st.integers(1, 6), limit=st.sampled_from([2.0, 3.0, 4.0, 8.0]), scale=st.sampled_from([0.25, 0.5, 3.0]))
def test_orders_do_not_depend_on_the_unit_of_memory(ranks, laps, shape, m, limit, scale):
    """Every activation and the limit times one factor: the same orders (an F's growth is its stage's,
    not one M_B: a stage holding half of one M_B under a limit of one fits two forwards)."""
    placement = getattr(Placement, shape)(ranks * laps, ranks)
    stages = len(placement.stage_to_rank)
    unit = Problem(ranks, stages, m, (placement,), CostModel(), limit, 0.5)
    scaled = Problem(ranks, stages, m, (placement,), CostModel(), limit * scale, 0.5,
                     activation=(scale,) * stages)
    assert list_schedule_orders(scaled) == list_schedule_orders(unit)
