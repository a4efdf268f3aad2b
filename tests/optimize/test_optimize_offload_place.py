"""offload_place: W brought forward (weights_within, a direct rank's own room), run earlier in the tails
(weights_filled) and climbed (weights_climbed): every result places, verifies and keeps the limit in time."""

from __future__ import annotations

import time
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import pipeforge
from benchmarks.zb_profiles import TABLE_5
from pipeforge.ir import ActionKind, CostModel, MemorySpec, Schedule
from pipeforge.library import load_library_schedule
from pipeforge.optimizer.offload_place import placed_offloads, weights_climbed, weights_filled, weights_within
from pipeforge.semantics import effects_of, held_after_additions
from pipeforge.verifier import verify

COSTS = CostModel(F=1.0, I=1.0, W=0.5, comm=0.05)


def _seed(name: str, ranks: int, microbatches: int, memory: MemorySpec) -> Schedule:
    return replace(load_library_schedule(name, {"P": ranks, "M": microbatches}), memory=memory)


def _tail_weights(program) -> int:
    """How many W a rank's program runs after its last F or I (held back to the end)."""
    kinds = [step.actions[0].kind for step in program]
    return len(kinds) - 1 - max(k for k, kind in enumerate(kinds) if kind is not ActionKind.W)


def _kept(schedule: Schedule, limit: float) -> bool:
    placed = replace(schedule, memory=replace(schedule.memory, limit=limit))
    timeline = pipeforge.simulate(placed, COSTS)
    return (verify(placed, solve=False).valid and max(timeline.peak_memory) <= limit + 1e-9
            and max(timeline.timed_peak_memory) <= limit + 1e-9)


def test_the_last_rank_holds_back_more_with_room_for_its_one_activation():
    """ZB-H2, 4 ranks: the last stage runs each I right after its F (it never has an activation away), so
    with ``direct_budget`` it holds back W up to the limit less one activation; the other ranks move alike."""
    memory = MemorySpec(2.0, 0.3)
    seed = _seed("zb-h2", 4, 12, memory)
    plain = weights_within(seed, memory, 0.0)
    direct = weights_within(seed, memory, 0.0, direct_budget=1.0)
    assert direct.programs[:3] == plain.programs[:3]
    assert _tail_weights(direct.programs[3]) > _tail_weights(plain.programs[3])
    effect = effects_of(memory, (a for _, _, a in direct.actions()))
    held = held_after_additions([[effect(a) for a in step.actions] for step in direct.programs[3]])
    assert max(held) <= memory.limit + 1e-9


def test_filled_tails_move_weights_earlier_only():
    """Each rank's W after its last F only come earlier: every W is preceded by at most the backwards it
    was, so what a rank holds in program order at each F, B and I is never more (and so its peak)."""
    memory = MemorySpec(4.0, 0.366)
    row = TABLE_5[0]
    seed = weights_within(_seed("zb-h2", 8, 24, memory), memory, 2.0, 2.0, 3.0)
    filled = weights_filled(seed, row.costs, memory)
    assert filled.programs != seed.programs
    effect = effects_of(memory, (a for _, _, a in seed.actions()))
    for before, after in zip(seed.programs, filled.programs):
        assert sorted(map(str, before)) == sorted(map(str, after))

        def held(program):
            amounts = held_after_additions([[effect(a) for a in step.actions] for step in program])
            return {step.actions[0]: h for step, h in zip(program, amounts)}
        now, was = held(after), held(before)
        assert all(now[a] <= was[a] + 1e-9 for a in now if a.kind is not ActionKind.W)
        assert max(now.values()) <= max(was.values()) + 1e-9


@settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck), database=None)
@given(st.sampled_from(["zb-h2", "zb-h1"]), st.integers(2, 4), st.integers(4, 10),
       st.sampled_from([0.5, 0.75, 1.0]), st.sampled_from([0.2, 0.37, 0.5]))
def test_filled_and_climbed_orders_place_verify_and_keep_the_limit(name, ranks, microbatches, fraction, weights):
    limit = max(2.5, fraction * ranks)
    memory = MemorySpec(limit, weights)
    order = weights_filled(weights_within(_seed(name, ranks, microbatches, memory), memory, limit - 2, limit - 2,
                                          limit - 1), COSTS, memory)
    start = placed_offloads(order, COSTS, memory, 0.0)
    climbed = weights_climbed(order, COSTS, memory, time.monotonic() + 0.5, 0.0)
    assert (start is None) == (climbed is None)
    if start is None:
        return
    assert _kept(start, limit)
    best, moved, span = climbed
    assert moved == placed_offloads(best, COSTS, memory, 0.0) and _kept(moved, limit)
    assert span == pytest.approx(pipeforge.simulate(moved, COSTS, memory=memory).makespan)
    assert span <= pipeforge.simulate(start, COSTS, memory=memory).makespan + 1e-9


def test_zero_bubble_row_at_half_the_memory_comes_within_five_percent():
    """Table 5's 1.5B row (p = 8, m = 24) at 0.5p M_B, transfers as long as F: ZB-H2's order with the last
    rank's own room and its tails filled, offloaded, then climbed to the end (about 250 placements), is
    within 5 % of the unlimited makespan (1236.5 ms, the least any schedule of the work can have:
    (p-1)(F+comm) + m(F+I+W)), keeps the limit in time and verifies; before the climb it is not."""
    row = TABLE_5[0]
    memory = MemorySpec(4.0, row.weights)
    free = (row.p - 1) * (row.costs.F + row.costs.comm) + row.m * (row.costs.F + row.costs.I + row.costs.W)
    order = weights_filled(weights_within(_seed("zb-h2", 8, 24, memory), memory, 2.0, 2.0, 3.0), row.costs, memory)
    start = placed_offloads(order, row.costs, memory, 0.0)
    assert pipeforge.simulate(start, row.costs, memory=memory).makespan > 1.05 * free
    _, placed, span = weights_climbed(order, row.costs, memory, float("inf"), 0.0)
    assert span <= 1.05 * free
    timeline = pipeforge.simulate(placed, row.costs)
    assert max(timeline.timed_peak_memory) <= 4.0 + 1e-9 and verify(placed, solve=False).valid
