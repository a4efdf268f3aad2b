"""The proven bounds (pipeforge.sim.bounds) never exceed what a schedule achieves, and say what they bound."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import pipeforge
from pipeforge.errors import PipeforgeError
from pipeforge.ir import Action, ActionKind, CostModel, MemorySpec, Placement
from pipeforge.optimizer import optimize
from pipeforge.optimizer.evaluate import Graph, Problem, evaluate
from pipeforge.optimizer.exact import solve_exact
from pipeforge.optimizer.greedy import best_zero_bubble_order
from pipeforge.sim import simulate
from pipeforge.sim.bounds import ARGUMENTS, rank_spans, span_lower_bound, work_bound
from tests.optimize.opt_instances import brute_force_best_span, per_stage_costs, random_programs, split_work

# (name, defines for a rank count p and microbatch count m, or None where the schedule needs other sizes)
LIBRARY = {
    "1f1b": lambda p, m: {"P": p, "M": m},
    "gpipe": lambda p, m: {"P": p, "M": m},
    "zb-h1": lambda p, m: {"P": p, "M": m},
    "zb-h2": lambda p, m: {"P": p, "M": m},
    "zbv": lambda p, m: {"P": p, "M": m},
    "v-min": lambda p, m: {"P": p, "M": m},
    "v-half": lambda p, m: {"P": p, "M": m},
    "interleaved-1f1b": lambda p, m: {"P": p, "V": 2, "M": p * m},
    "interleaved-zb": lambda p, m: {"P": p, "V": 2, "M": p * m},
    "looped-bfs": lambda p, m: {"P": p, "V": 2, "M": m},
    "dualpipev": lambda p, m: {"P": p, "M": 2 * p + m},
    "chimera": lambda p, m: {"P": 2 * ((p + 1) // 2), "M": 2 * ((p + 1) // 2)},
}
def library_schedule(name: str, p: int, m: int):
    try:
        return pipeforge.load(name, defines=LIBRARY[name](p, m))
    except PipeforgeError:
        return None  # sizes the schedule refuses


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(name=st.sampled_from(sorted(LIBRARY)), p=st.integers(1, 4), m=st.integers(1, 6), data=st.data(),
       weights=st.sampled_from([0.0, 0.366, 0.5, 1.0]), slack=st.sampled_from([0.0, 0.5, 3.0]))
def test_every_bound_holds_for_every_library_schedule(name, p, m, data, weights, slack):
    schedule = library_schedule(name, p, m)
    if schedule is None:
        return
    costs = data.draw(per_stage_costs(schedule.stages))
    timeline = simulate(schedule, costs, memory=MemorySpec(weights=weights))
    span = max(s.span for s in timeline.rank_stats)
    # space 2 at the schedule's own peak (and above it): no schedule of the work that holds no more does better
    assert timeline.work_bound.max_span <= span + 1e-9
    limited = simulate(schedule, costs, memory=MemorySpec(limit=max(timeline.peak_memory) + slack, weights=weights))
    assert limited.work_bound.max_span <= span + 1e-9
    assert limited.work_bound.bubble_rate <= timeline.bubble_rate + 1e-9
    # space 1: the orders of these very actions
    assert timeline.lower_bound <= timeline.makespan + 1e-9
    assert timeline.bubble_lower_bound <= timeline.bubble_rate + 1e-9


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(p=st.integers(1, 4), m=st.integers(1, 5), data=st.data(), limit=st.sampled_from([1.0, 1.5, 2.0, 3.0]),
       placement=st.sampled_from(["keep", "any"]), strategy=st.sampled_from(["greedy", "auto"]))
def test_every_bound_holds_for_every_optimized_schedule(p, m, data, limit, placement, strategy):
    costs = data.draw(per_stage_costs(p))
    schedule = pipeforge.load("1f1b", defines={"P": p, "M": m})
    result = optimize(schedule, costs=costs, memory_limit=limit * p, strategy=strategy, placement=placement,
                      time_limit=1.0)
    assert result.span_bound <= result.after.max_span + 1e-9
    assert result.bound <= result.after.bubble_rate + 1e-9
    timeline = simulate(result.schedule)
    assert timeline.work_bound.max_span <= max(s.span for s in timeline.rank_stats) + 1e-9


def loop_problem(p, m, limit, costs, weights=0.5):
    return Problem(p, p, m, (Placement.loop(p, p),), costs, limit, weights)


@settings(max_examples=25, deadline=None)
@given(p=st.integers(1, 3), m=st.integers(1, 2), data=st.data(), limit=st.sampled_from([None, 1.0, 2.0, 3.0, 6.0]),
       weights=st.sampled_from([0.5, 0.25]))
def test_the_bound_never_exceeds_the_brute_force_optimum_with_per_stage_costs(p, m, data, limit, weights):
    problem = loop_problem(p, m, limit, data.draw(per_stage_costs(p)), weights)
    brute = brute_force_best_span(problem)
    assert brute is not None
    assert span_lower_bound(Graph(problem, split_work(p, m)), limit) <= brute + 1e-9


def test_the_bound_through_the_last_rank_proves_zb_2p_optimal():
    # 1.5B, p = 8, m = 24, 2p: the pipeline's fill, every microbatch's F and I on the last rank, and the
    # drain make rank 0's span; the Zero Bubble heuristic reaches it (the paper's 0.0433).
    costs = CostModel(F=18.522, I=18.086, W=9.337, comm=0.601)
    problem = loop_problem(8, 24, 16.0, costs, weights=0.366)
    graph = Graph(problem, split_work(8, 24))
    bound = work_bound(graph, 16.0)
    best = evaluate(graph, tuple(graph.ids(keys) for keys in best_zero_bubble_order(problem).keys))
    assert bound.bubble_rate == pytest.approx(best.bubble_rate, abs=1e-9)
    assert bound.bubble_rate == pytest.approx(0.0433, abs=5e-5)
    assert bound.binding.rank == 0 and bound.binding.argument == "through rank 7"
    assert bound.binding.through == pytest.approx(7 * (costs.F + costs.I + 2 * costs.comm) + costs.W
                                                 + 24 * (costs.F + costs.I))


def test_the_bound_says_what_it_bounds():
    problem = loop_problem(4, 8, 4.0, CostModel(F=1, I=1, W=1, comm=0.0))
    data = work_bound(Graph(problem, split_work(4, 8)), 4.0).to_json()
    assert data["argument"] in ("busy", "round trip") or data["argument"].startswith("through rank")
    assert set(data["arguments"]) == set(ARGUMENTS) and len(data["ranks"]) == 4
    assert data["ranks"][data["rank"]]["span"] == pytest.approx(data["max_span"])


def test_fused_work_is_bounded_by_busy_and_round_trips_only():
    # A B is one action: the one-machine bound (which reads I and W apart) says nothing there.
    problem = loop_problem(3, 3, None, CostModel())
    fused = [Action(s, k, mb) for s in range(3) for mb in range(3) for k in (ActionKind.F, ActionKind.B)]
    assert all(r.through == 0.0 for r in rank_spans(Graph(problem, fused), None))


def v_graph(p, m, limit, costs):
    stages = 2 * p
    problem = Problem(p, stages, m, (Placement.v(stages, p),), costs, limit, 0.5)
    return Graph(problem, [Action(s, k, mb) for s in range(stages) for mb in range(m)
                           for k in (ActionKind.F, ActionKind.I, ActionKind.W)])


@pytest.mark.parametrize(("graph", "limit"), [
    (Graph(loop_problem(3, 3, 6.0, CostModel(F=1, I=1, W=0.5, comm=0.25)), split_work(3, 3)), 6.0),  # 2p
    (Graph(loop_problem(2, 4, 4.0, CostModel(F=2, I=1, W=1, comm=0.5)), split_work(2, 4)), 4.0),     # 2p
    (v_graph(2, 2, 4.0, CostModel(F=1, I=1, W=1, comm=0.0)), 4.0),                                  # V, 1p
])
def test_exact_search_proves_optimality_at_2p_and_for_v(graph, limit):
    from pipeforge.optimizer.list_schedule import list_schedule_orders

    orders = [tuple(graph.ids(keys) for keys in found) for _, found in list_schedule_orders(graph.problem)]
    start = min((o for o in orders if evaluate(graph, o).fits(limit)), key=lambda o: evaluate(graph, o).key())
    result = solve_exact(graph, start, span_lower_bound(graph, limit), time_limit=60)
    assert result.optimal and result.lower_bound == pytest.approx(result.upper_bound, rel=1e-6)
    assert span_lower_bound(graph, limit) <= result.upper_bound + 1e-9


def chunked_graph(shape: str, p: int, m: int, limit: float | None, costs: CostModel, weights: float = 0.5) -> Graph:
    """Two stages a rank, in a V or in loop order (interleaved), the work split into F, I and W."""
    stages = 2 * p
    placement = Placement.v(stages, p) if shape == "v" else Placement.loop(stages, p)
    problem = Problem(p, stages, m, (placement,), costs, limit, weights)
    return Graph(problem, [Action(s, k, mb) for s in range(stages) for mb in range(m)
                           for k in (ActionKind.F, ActionKind.I, ActionKind.W)])


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(shape=st.sampled_from(["v", "interleaved"]), p=st.integers(1, 3), m=st.integers(1, 4), data=st.data(),
       seed=st.integers(0, 10**6), weights=st.sampled_from([0.0, 0.366, 0.5]), slack=st.sampled_from([0.0, 0.5, 2.0]))
def test_every_bound_holds_for_random_orders_in_v_and_interleaved_placements(shape, p, m, data, seed, weights, slack):
    # Any order that runs, at its own peak memory (and a little above): no bound exceeds its worst span.
    costs = data.draw(per_stage_costs(2 * p))
    graph = chunked_graph(shape, p, m, None, costs, weights)
    placement = graph.problem.placements[0]
    programs = random_programs(p, list(graph.actions), seed, placement)
    evaluation = evaluate(graph, tuple(graph.ids(program) for program in programs))
    limit = max(evaluation.peak_memory) + slack
    for proved in rank_spans(graph, limit):  # what is proved of each rank holds for that very rank
        assert proved.span <= evaluation.spans[proved.rank] + 1e-9
    assert span_lower_bound(graph, limit) <= evaluation.max_span + 1e-9


def test_the_memory_chain_binds_at_small_limits():
    # 1.5B, p = 8, m = 24 at 0.5p (4 M_B): rank 0 holds at most 4 forwards, each a round trip R; its
    # 24th forward starts no earlier than 5 R + 3 F, and its span ends R + W after that.
    costs = CostModel(F=18.522, I=18.086, W=9.337, comm=0.601)
    problem = loop_problem(8, 24, 4.0, costs, weights=0.366)
    graph = Graph(problem, split_work(8, 24))
    bound = work_bound(graph, 4.0)
    trip = 8 * costs.F + 8 * costs.I + 14 * costs.comm
    assert bound.binding.rank == 0 and bound.binding.argument == "memory chain"
    assert bound.max_span == pytest.approx(6 * trip + 3 * costs.F + costs.W)
    assert bound.bubble_rate == pytest.approx(0.4111, abs=5e-5)  # the round trip alone: 0.2620
    best = evaluate(graph, tuple(graph.ids(keys) for keys in best_zero_bubble_order(problem).keys))
    assert bound.max_span <= best.max_span + 1e-9


@pytest.mark.parametrize(("shape", "limit", "bound", "optimum"), [
    ("v", 2.0, 133.0, 147.0),  # 0.5p: one microbatch's two chunks fill a rank (the chunk chain; 118 without it)
    ("interleaved", 4.0, 105.0, 109.0),  # 1p
])
def test_exact_search_proves_optimality_above_the_bound_for_chunked_placements(shape, limit, bound, optimum):
    # z3 proves no order beats the optimum although the bound is lower: optimality at small sizes does
    # not rest on the bound alone.
    from pipeforge.optimizer.list_schedule import list_schedule_orders

    graph = chunked_graph(shape, 2, 2, limit, CostModel(F=9, I=9, W=5, comm=1), weights=0.4)
    orders = [tuple(graph.ids(keys) for keys in found) for _, found in list_schedule_orders(graph.problem)]
    start = min((o for o in orders if evaluate(graph, o).fits(limit)), key=lambda o: evaluate(graph, o).key())
    assert span_lower_bound(graph, limit) == pytest.approx(bound)
    result = solve_exact(graph, start, span_lower_bound(graph, limit), time_limit=60)
    assert result.optimal and result.upper_bound == pytest.approx(optimum)
