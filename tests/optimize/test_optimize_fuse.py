"""Keeping a B whole or splitting it (``optimizer/fuse.py``) where the costs say B != I + W."""

from __future__ import annotations

import random
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from benchmarks.profile.loop import deferred_w
from pipeforge import loads
from pipeforge.ir import ActionKind, CostModel, MemorySpec
from pipeforge.library import load_library_schedule
from pipeforge.optimizer import optimize
from pipeforge.optimizer.evaluate import Graph, Problem, compute_actions, evaluate, is_complete
from pipeforge.optimizer.fuse import FuseSearch, Mix, fusable_stages, least_work, moves_of
from pipeforge.optimizer.search import split_actions
from pipeforge.sim import simulate
from pipeforge.sim.workgraph import peak_memory
from pipeforge.verifier import verify
from tests.load import scaled

B = ActionKind.B


def per_stage(stages: list[dict]) -> CostModel:
    return CostModel(per_stage=tuple((s, kind, value) for s, costs in enumerate(stages) for kind, value in costs.items()))


# What the profile -> optimize -> run loop measured on the GPT with a heavy embedding and LM head (ms).
LOOP = per_stage([{"F": 9.0, "I": 0.13, "W": 17.4, "B": 17.46}, {"F": 9.1, "I": 9.05, "W": 9.3, "B": 15.9}])
# Like test_optimize_command.FUSED_CHEAPER: B about 0.8 of I + W on every stage.
CHEAPER = per_stage([{"F": 3.1, "I": 2.9, "W": 2.2, "B": 4.0}, {"F": 3.0, "I": 3.0, "W": 2.1, "B": 4.1},
                     {"F": 3.1, "I": 2.9, "W": 2.2, "B": 4.0}, {"F": 3.2, "I": 3.1, "W": 2.4, "B": 4.6}])


def library(name: str, p: int, m: int):
    return load_library_schedule(name, {"P": p, "M": m})


def simulated(schedule, costs: CostModel, limit: float):
    timeline = simulate(schedule, costs, memory=MemorySpec(limit))
    assert max(timeline.peak_memory) <= limit + 1e-9
    return timeline


def worst(timeline) -> float:
    return max(stats.span for stats in timeline.rank_stats)


def check(result, costs: CostModel, limit: float):
    """The result verifies, fits the limit and simulates to what optimize reports."""
    assert verify(result.schedule, memory_limit=limit).valid
    timeline = simulated(result.schedule, costs, limit)
    assert worst(timeline) == pytest.approx(result.after.max_span)
    return timeline


def test_loop_costs_reach_the_hand_built_deferred_w():
    """2 ranks, the loop's in-run costs, M = 8, 1p: at or below deferred-w (223.08), below ZB-H1 (228.6)."""
    hand = simulated(loads(deferred_w(2, 8)), LOOP, 2)
    zb = simulated(library("zb-h1", 2, 8), LOOP, 2)
    result = optimize(library("1f1b", 2, 8), costs=LOOP, memory_limit=2, strategy="local", time_limit=10)
    timeline = check(result, LOOP, 2)
    assert result.found_by == "fuse"
    assert worst(timeline) <= worst(hand) + 1e-9 and timeline.makespan <= hand.makespan + 1e-9
    assert timeline.makespan < zb.makespan
    kinds = {a.kind for program in result.schedule.programs for step in program for a in step.actions}
    assert B in kinds and ActionKind.W in kinds  # some B kept whole, some split


# What `pipeforge profile` measured of the same model (dispatch included): the first stage's B costs more
# than its I + W (its I is almost nothing), the last stage's less; one link of 1.96.
MIXED = CostModel(per_stage=per_stage([{"F": 13.59, "I": 0.465, "W": 27.05, "B": 28.56},
                                       {"F": 14.42, "I": 14.72, "W": 14.91, "B": 26.41}]).per_stage,
                  links=(1.96,))


def test_auto_splits_where_b_is_dearer_and_fuses_where_it_is_cheaper():
    """From 1F1B (every B whole) with the profiled costs, auto at its default limit reaches deferred-w (the
    first stage's B split, I + W < B there; the last stage's kept whole but for its first and last): it
    needs the input among the fuse search's seeds and a descent from each seed, not only the best."""
    hand = simulated(loads(deferred_w(2, 8)), MIXED, 2)
    result = optimize(library("1f1b", 2, 8), costs=MIXED, memory_limit=2, strategy="auto")
    timeline = check(result, MIXED, 2)
    assert worst(timeline) <= worst(hand) + 1e-9
    assert worst(timeline) < worst(simulated(library("zb-h1", 2, 8), MIXED, 2))
    assert result.found_by == "fuse"


def test_cheaper_b_beats_the_all_split_and_all_fused_library_orders():
    limit = 4
    best = min(worst(simulated(library(name, 4, 8), CHEAPER, limit)) for name in ("1f1b", "zb-h1"))
    result = optimize(library("1f1b", 4, 8), costs=CHEAPER, memory_limit=limit, time_limit=6)
    check(result, CHEAPER, limit)
    assert result.after.max_span <= best + 1e-9
    assert result.span_bound <= result.after.max_span + 1e-9


def test_where_b_is_i_plus_w_nothing_is_fused():
    """B given as I + W per stage: no stage is fusable, and the result is the same as with B left out."""
    split = [{"F": 1.0, "I": 1.0, "W": 2.0}, {"F": 2.0, "I": 1.0, "W": 1.0}, {"F": 1.0, "I": 2.0, "W": 1.0}]
    given = per_stage([dict(s, B=s["I"] + s["W"]) for s in split])
    schedule = library("1f1b", 3, 6)
    assert not fusable_stages(Problem.of(schedule, given, 3))
    with_b = optimize(schedule, costs=given, memory_limit=3, strategy="local", time_limit=3)
    without = optimize(schedule, costs=per_stage(split), memory_limit=3, strategy="local", time_limit=3)
    assert with_b.found_by != "fuse" and with_b.schedule.programs == without.schedule.programs
    assert with_b.after.max_span == without.after.max_span


def split_graph(schedule, costs: CostModel, limit: float) -> Graph:
    problem = Problem.of(schedule, costs, limit)
    return Graph(problem, split_actions(compute_actions(schedule.compute_only())))


def search_of(schedule, costs: CostModel, limit: float) -> FuseSearch:
    return FuseSearch(split_graph(schedule, costs, limit), time.monotonic() + 60, 0.0)


def input_mix(search: FuseSearch, schedule) -> Mix:
    """The schedule's own order as a mix, timed."""
    graph = Graph(search.problem, compute_actions(schedule.compute_only()))
    fused, order = search.work.mix_of(graph, graph.order_of(schedule.compute_only()))
    return search.judge((fused, search.work.view(fused), order, None))


def test_moves_fuse_at_the_i_or_the_w_and_split_back():
    schedule = library("zb-h1", 2, 4)
    search = search_of(schedule, LOOP, 2)
    assert search.fusable == frozenset({0, 1})
    mix = input_mix(search, schedule)
    assert not mix.fused and sum(map(len, mix.order)) == 2 * 4 * 3
    fused, order = least_work(search.work, mix.fused, mix.order, search.fusable, frozenset())
    assert len(fused) == 2 * 4 and sum(map(len, order)) == 2 * 4 * 2  # every pair fused at its I
    least = search.judge((fused, search.work.view(fused), order, None))
    found = [candidate for r, seq in enumerate(least.order) for p, node in enumerate(seq) if node in least.fused
             for candidate in moves_of(search.work, least, r, p, frozenset())]
    assert 2 * 4 <= len(found) <= 2 * 4 * 2  # per B: its W right after the I, and at the end of the rank
    fuses = []
    for p, node in enumerate(mix.order[0]):
        if mix.view.actions[node].kind is ActionKind.I:
            adjacent = mix.order[0][p + 1] == search.work.weight_of[node]
            moves = list(moves_of(search.work, mix, 0, p, frozenset()))
            assert len(moves) == (1 if adjacent else 2)  # fused at the I and at the W (the same when adjacent)
            fuses += moves
    for fused, view, order, _ in found + fuses:
        assert sum(map(len, order)) == 2 * 4 * 3 - len(fused)
        graph, ids = search.work.compiled(view, order)
        assert is_complete(graph, ids)  # every move is a complete set of actions


def test_fused_b_memory_is_the_semantics_rule():
    """A fused B releases the whole activation at once: all-fused ZB-H1 holds what 1F1B holds."""
    schedule = library("zb-h1", 4, 8)
    search = search_of(schedule, CHEAPER, 4)
    mix = input_mix(search, schedule)
    fused, order = least_work(search.work, mix.fused, mix.order, search.fusable, frozenset())
    view = search.work.view(fused)
    assert [peak_memory(view, seq) for seq in order] == list(simulate(library("1f1b", 4, 8), CHEAPER).peak_memory)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(p=st.integers(2, 4), m=st.integers(1, 5), seed=st.integers(0, 10**6), name=st.sampled_from(["1f1b", "zb-h1"]),
       costs=st.sampled_from([LOOP, MIXED, CHEAPER]), tight=st.booleans())
def test_a_move_times_like_its_own_compiled_graph(p, m, seed, name, costs, tight):
    """Every move of a random walk, timed on the mix from its first change on (``FuseSearch.judge``), gives
    what ``evaluate`` gives on a work graph compiled from its actions (None both where it cannot run or
    does not fit the limit): the mix is the fused set's own graph under other ids."""
    costs = CostModel(per_stage=tuple(entry for entry in costs.per_stage if entry[0] < p) + tuple(
        (s, kind, value) for s in range(p) for kind, value in (("F", 2.0), ("I", 1.5), ("W", 1.0), ("B", 2.0))
        if s >= len({e[0] for e in costs.per_stage})), links=costs.links[:p - 1])
    schedule = library(name, p, m)
    limit = max(simulate(schedule, costs).peak_memory) if tight else 10.0 ** 9  # tight: the input's own peak
    search = search_of(schedule, costs, limit)
    rng = random.Random(seed)
    mix = input_mix(search, schedule)
    for _ in range(12):
        r = rng.randrange(p)
        nodes = [q for q, node in enumerate(mix.order[r]) if search.work.split.actions[node].kind is ActionKind.I]
        candidates = list(moves_of(search.work, mix, r, rng.choice(nodes), mix.idle()))
        candidate = rng.choice(candidates)
        judged = search.judge(candidate, mix)
        graph, order = search.work.compiled(candidate[1], candidate[2])
        compiled = evaluate(graph, order)
        if compiled is not None and not compiled.fits(search.limit):
            compiled = None
        assert (judged is None) == (compiled is None)
        if judged is not None:
            assert judged.evaluation == compiled
            mix = judged


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(p=st.integers(1, 3), m=st.integers(1, 4), f=st.sampled_from([1.0, 2.0]), i=st.sampled_from([0.5, 1.0, 2.0]),
       w=st.sampled_from([0.5, 1.0, 2.0]), share=st.sampled_from([0.6, 0.8, 0.95]),
       name=st.sampled_from(["1f1b", "zb-h1"]), strategy=st.sampled_from(["local", "auto"]))
def test_fusing_never_worse_never_invalid(p, m, f, i, w, share, name, strategy):
    costs = CostModel(F=f, I=i, W=w, B=share * (i + w))
    schedule = library(name, p, m)
    result = optimize(schedule, costs=costs, memory_limit=p, strategy=strategy, time_limit=1)
    before = simulate(schedule, costs)
    if max(before.peak_memory) <= p:
        assert result.after.max_span <= worst(before) + 1e-9
    assert result.span_bound <= result.after.max_span + 1e-9
    if result.improved:
        check(result, costs, p)


def without_b(costs: CostModel) -> CostModel:
    """The same costs with B left out (B = I + W): the split work times the same, nothing fuses."""
    return CostModel(per_stage=tuple(entry for entry in costs.per_stage if entry[1] != "B"), links=costs.links)


@pytest.mark.parametrize("name", ["1f1b", "zb-h1"])
def test_explicit_greedy_fuses_where_b_is_cheaper_and_never_loses(name):
    """Greedy orders the split work; its fuse pass then keeps B whole where that wins: never worse than the
    greedy orders alone (the same costs without B), here strictly better."""
    schedule = library(name, 4, 8)
    alone = optimize(schedule, costs=without_b(CHEAPER), memory_limit=4, strategy="greedy", time_limit=5)
    result = optimize(schedule, costs=CHEAPER, memory_limit=4, strategy="greedy", time_limit=5)
    check(result, CHEAPER, 4)
    assert alone.fuse is None and result.fuse == "greedy" and result.found_by == "fuse"
    assert result.after.max_span < alone.after.max_span
    assert result.to_json()["fuse"]["pass"] == "greedy"


def test_explicit_exact_keeps_its_split_bound_apart_and_then_fuses():
    """Exact search proves a bound on orders of the split work only: with B < I + W it is reported as
    ``split_bound``, never as the bound (fused orders may beat it), and fuse descents follow."""
    schedule = library("1f1b", 3, 4)
    alone = optimize(schedule, costs=without_b(CHEAPER3), memory_limit=3, strategy="exact", time_limit=4)
    result = optimize(schedule, costs=CHEAPER3, memory_limit=3, strategy="exact", time_limit=4)
    check(result, CHEAPER3, 3)
    assert alone.fuse is None and alone.split_bound is None
    assert result.fuse == "exact" and result.split_bound is not None
    assert result.after.max_span < alone.after.max_span
    # the bound is the one of every order (sim.bounds'), never raised by exact's bound on the split orders
    assert result.span_bound == pytest.approx(min(result.work_bound.max_span, result.after.max_span))
    assert result.optimal == (result.gap <= 1e-6) and (result.stopped == "bound") == result.optimal
    data = result.to_json()["fuse"]
    assert data["pass"] == "exact" and "split work only" in data["means"] and data["split_bound"] == result.split_bound


CHEAPER3 = CostModel(per_stage=tuple(entry for entry in CHEAPER.per_stage if entry[0] < 3))


@pytest.mark.parametrize("strategy", ["greedy", "exact"])
def test_where_b_is_i_plus_w_explicit_strategies_run_no_fuse_pass(strategy):
    given = per_stage([{"F": 1.0, "I": 1.0, "W": 2.0, "B": 3.0}, {"F": 2.0, "I": 1.0, "W": 1.0, "B": 2.0},
                       {"F": 1.0, "I": 2.0, "W": 1.0, "B": 3.0}])
    result = optimize(library("1f1b", 3, 4), costs=given, memory_limit=3, strategy=strategy, time_limit=3)
    assert result.fuse is None and result.found_by != "fuse" and result.to_json()["fuse"] is None


@pytest.mark.parametrize("strategy, p, m, limit", [("greedy", 8, 32, 1.5), ("auto", 8, 32, 1.5), ("exact", 4, 8, 2.0)])
def test_the_fuse_passes_keep_the_time_limit(strategy, p, m, limit):
    """The fuse descents stop at the search's deadline, which leaves the verification its time (budget.py)."""
    costs = CostModel(per_stage=tuple((s, kind, value) for s in range(p) for t, kind, value in CHEAPER.per_stage
                                      if t == s % 4))  # CHEAPER's four stages repeated
    started = time.monotonic()
    result = optimize(library("1f1b", p, m), costs=costs, memory_limit=p, strategy=strategy, time_limit=limit)
    assert result.fuse is not None
    assert result.seconds <= limit + scaled(1.0) and time.monotonic() - started <= limit + scaled(1.0)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(p=st.integers(2, 3), m=st.integers(2, 5), values=st.tuples(*[st.floats(0.5, 20)] * 3),
       share=st.sampled_from([0.6, 0.85, 1.2]), factor=st.floats(1e-3, 1e3),
       strategy=st.sampled_from(["greedy", "auto"]))
def test_fusing_does_not_depend_on_units(p, m, values, share, factor, strategy):
    """Scaling every cost by a positive factor gives the same schedule and bubble rate, fuse pass included
    (where both searches ran to their end, not to the time limit)."""
    f, i, w = values
    results = [optimize(library("1f1b", p, m), costs=CostModel(F=f * k, I=i * k, W=w * k, B=share * (i + w) * k),
                        memory_limit=p, strategy=strategy, time_limit=10) for k in (1.0, factor)]
    if "time" in (results[0].stopped, results[1].stopped):
        return
    assert results[0].schedule.programs == results[1].schedule.programs
    assert results[0].found_by == results[1].found_by
    assert results[0].after.bubble_rate == pytest.approx(results[1].after.bubble_rate, rel=1e-9, abs=1e-12)
    assert results[1].after.max_span == pytest.approx(results[0].after.max_span * factor, rel=1e-9)


def test_a_fused_order_beats_what_exact_proves_for_the_split_work():
    """2 ranks, M = 3, the loop's costs: exact search settles the split orders (their optimum, 90.28), and a
    fused order is shorter, so that number is no bound on every order: the reported bound stays below."""
    costs = CostModel(per_stage=LOOP.per_stage)
    result = optimize(library("1f1b", 2, 3), costs=costs, memory_limit=2, strategy="exact", time_limit=8)
    check(result, costs, 2)
    assert result.split_bound == pytest.approx(90.28)
    assert result.after.max_span < result.split_bound and result.span_bound <= result.after.max_span + 1e-9
