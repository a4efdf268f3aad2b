"""The optimizer's evaluator against pipeforge.sim, on tables and random orders."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeforge.ir import ActionKind, CostModel, MemorySpec
from pipeforge.optimizer.evaluate import Graph, Problem, compute_actions, evaluate, is_complete, schedule_of
from pipeforge.sim import simulate
from tests.optimize.opt_instances import (
    costs_strategy, fused_work, make_schedule, one_f_one_b, random_programs, split_work,
)

F, B, I, W = ActionKind.F, ActionKind.B, ActionKind.I, ActionKind.W


def evaluated(schedule, costs=None):
    problem = Problem.of(schedule, costs)
    graph = Graph(problem, compute_actions(schedule))
    return graph, evaluate(graph, graph.order_of(schedule))


@pytest.mark.parametrize(("p", "m", "span", "bubble"), [
    (4, 8, 33.0, 1 - 24 / 33),   # 1F1B: (M + P - 1)(F + B)
    (2, 2, 9.0, 1 - 6 / 9),
    (3, 6, 24.0, 1 - 18 / 24),
])
def test_one_f_one_b_unit_costs(p, m, span, bubble):
    _, evaluation = evaluated(make_schedule(p, m, one_f_one_b(p, m)))
    assert evaluation.max_span == pytest.approx(span)
    assert evaluation.bubble_rate == pytest.approx(bubble)
    assert evaluation.peak_memory == tuple(float(min(m, p - r)) for r in range(p))


def test_an_order_that_waits_forever_evaluates_to_none():
    programs = one_f_one_b(2, 2)
    stuck = ((programs[0][2],) + programs[0][:2] + programs[0][3:], programs[1])
    graph, evaluation = evaluated(make_schedule(2, 2, stuck))
    assert evaluation is None


def test_completeness_check_catches_a_missing_and_a_misplaced_action():
    schedule = make_schedule(2, 2, one_f_one_b(2, 2))
    graph = Graph(Problem.of(schedule), compute_actions(schedule))
    order = graph.order_of(schedule)
    assert is_complete(graph, order)
    assert not is_complete(graph, (order[0][1:], order[1]))
    assert not is_complete(graph, (order[0] + order[1][:1], order[1][1:]))


@settings(max_examples=40, deadline=None)
@given(p=st.integers(1, 4), m=st.integers(1, 4), seed=st.integers(0, 10**6), costs=costs_strategy,
       split=st.booleans(), weights=st.sampled_from([0.5, 0.25]))
def test_agrees_with_pipeforge_sim(p, m, seed, costs, split, weights):
    work = split_work(p, m) if split else fused_work(p, m)
    schedule = make_schedule(p, m, random_programs(p, work, seed), costs)
    memory = MemorySpec(None, weights)
    problem = Problem.of(schedule)
    problem = Problem(problem.ranks, problem.stages, problem.microbatches, problem.placements,
                      problem.costs, None, weights)
    graph = Graph(problem, compute_actions(schedule))
    evaluation = evaluate(graph, graph.order_of(schedule))
    timeline = simulate(schedule, costs, memory=memory)
    assert evaluation.makespan == pytest.approx(timeline.makespan)
    assert evaluation.bubble_rate == pytest.approx(timeline.bubble_rate)
    assert evaluation.peak_memory == pytest.approx(timeline.peak_memory)
    assert evaluation.spans == pytest.approx(tuple(s.span for s in timeline.rank_stats))


def test_schedule_of_round_trips_the_order():
    schedule = make_schedule(3, 4, one_f_one_b(3, 4, split=True), CostModel(comm=0.5), limit=3)
    graph = Graph(Problem.of(schedule), compute_actions(schedule))
    order = graph.order_of(schedule)
    rebuilt = schedule_of(schedule, graph, order)
    assert rebuilt.programs == schedule.programs
    assert rebuilt.memory.limit == 3
