"""The shapes the papers give the library's schedules: warm-up depth, microbatches in flight,
and (on the unit cost model F = I = W = 1, B = 2, comm = 0) closed-form bubble rates,
each with the exact range of P and M where it holds.
"""

from __future__ import annotations

import pytest

from pipeforge import library
from pipeforge.ir import ActionKind, CostModel, MemorySpec, Schedule
from pipeforge.sim import simulate

F, B, I, W = ActionKind.F, ActionKind.B, ActionKind.I, ActionKind.W


def load(name: str, ranks: int, microbatches: int, **more: int) -> Schedule:
    return library.load_library_schedule(name, {"P": ranks, "M": microbatches, **more})


def kinds(schedule: Schedule, rank: int) -> list[ActionKind]:
    return [action.kind for step in schedule.programs[rank] for action in step.actions]


def warmup_depth(schedule: Schedule, rank: int) -> int:
    """Forwards a rank issues before its first backward (B or I)."""
    order = kinds(schedule, rank)
    first = next(i for i, kind in enumerate(order) if kind in (B, I))
    return order[:first].count(F)


def peak_in_flight(schedule: Schedule, rank: int, released_by=(B, I)) -> int:
    """Most microbatches forwarded and not yet released (by B or I, or with released_by=(B, W) by B or W)."""
    held = peak = 0
    for kind in kinds(schedule, rank):
        held += (kind is F) - (kind in released_by)
        peak = max(peak, held)
    return peak


SIZES = [(p, m) for p in range(1, 7) for m in range(1, 3 * p + 2)]

WARMUP = {
    "gpipe": lambda P, M, r: M,
    "1f1b": lambda P, M, r: min(M, P - r),
    "zb-h1": lambda P, M, r: min(M, P - r),
    "zb-h2": lambda P, M, r: min(M, 2 * (P - r) - 1),
}


@pytest.mark.parametrize("name", sorted(WARMUP))
def test_warmup_depth_per_rank(name):
    for ranks, microbatches in SIZES:
        schedule = load(name, ranks, microbatches)
        expected = [WARMUP[name](ranks, microbatches, r) for r in range(ranks)]
        assert [warmup_depth(schedule, r) for r in range(ranks)] == expected, (ranks, microbatches)


@pytest.mark.parametrize("name,ranks,microbatches", [("zbv", 4, 8), ("zbv", 3, 5), ("dualpipev", 4, 8), ("dualpipev", 3, 9)])
def test_v_schedules_forward_2p_microbatch_stages_before_their_first_backward(name, ranks, microbatches):
    schedule = load(name, ranks, microbatches)
    depths = [warmup_depth(schedule, r) for r in range(ranks)]
    # DualPipeV's last rank runs its first F(s0) alone before the first B, to shorten its bubble
    assert depths == [2 * ranks] * (ranks - 1) + [2 * ranks + (name == "dualpipev")]


def test_interleaved_warmup_follows_megatron():
    for ranks, microbatches, per_rank in [(4, 8, 2), (4, 16, 4), (3, 6, 4), (2, 3, 3)]:
        schedule = load("interleaved-1f1b", ranks, microbatches, V=per_rank)
        per_round = microbatches // max(1, microbatches // ranks)
        for r in range(ranks):
            expected = min((per_rank - 1) * per_round + 2 * (ranks - 1 - r) + 1, per_rank * microbatches)
            assert warmup_depth(schedule, r) == expected


def test_1f1b_holds_p_minus_r_microbatches_and_gpipe_all():
    for ranks, microbatches in SIZES:
        one_f_one_b, gpipe = load("1f1b", ranks, microbatches), load("gpipe", ranks, microbatches)
        assert [peak_in_flight(one_f_one_b, r) for r in range(ranks)] == [min(microbatches, ranks - r) for r in range(ranks)]
        assert [peak_in_flight(gpipe, r) for r in range(ranks)] == [microbatches] * ranks


def test_zb_h1_keeps_the_memory_of_1f1b():
    for ranks, microbatches in SIZES:
        zb, one_f_one_b = load("zb-h1", ranks, microbatches), load("1f1b", ranks, microbatches)
        awaiting_input = [peak_in_flight(zb, r) for r in range(ranks)]
        assert awaiting_input == [peak_in_flight(one_f_one_b, r) for r in range(ranks)]
        # counting a microbatch until its W: P on every rank once M >= P, 1F1B's peak (on rank 0)
        awaiting_weights = [peak_in_flight(zb, r, (B, W)) for r in range(ranks)]
        assert max(awaiting_weights) == max(peak_in_flight(one_f_one_b, r) for r in range(ranks))
        if microbatches >= ranks:
            assert awaiting_weights == [ranks] * ranks


def test_zb_h2_holds_2p_minus_1_microbatches():
    for ranks, microbatches in SIZES:
        if microbatches >= 2 * ranks - 1:
            schedule = load("zb-h2", ranks, microbatches)
            assert [peak_in_flight(schedule, r, (B, W)) for r in range(ranks)] == [2 * ranks - 1] * ranks


def test_chimera_balances_activations_between_p_over_2_plus_1_and_p():
    for ranks, microbatches in [(2, 2), (4, 4), (4, 12), (6, 6), (8, 16)]:
        schedule = load("chimera", ranks, microbatches)
        half = ranks // 2
        assert [peak_in_flight(schedule, r) for r in range(ranks)] == [half + 1 + min(r, ranks - 1 - r) for r in range(ranks)]


# (closed form, the exact condition on P and M under which the simulated bubble rate equals it);
# Chimera's is on the cost model of its paper's drawings, F = B = 1
BUBBLES = {
    "gpipe": (lambda P, M, V: (P - 1) / (M + P - 1), lambda P, M: True),
    "1f1b": (lambda P, M, V: (P - 1) / (M + P - 1), lambda P, M: True),
    "interleaved-1f1b": (lambda P, M, V: (P - 1) / (V * M + P - 1), lambda P, M: M >= P),
    "zb-h1": (lambda P, M, V: (P - 1) / (3 * M + P - 1), lambda P, M: M >= P),
    "zb-h2": (lambda P, M, V: 0.0, lambda P, M: M >= 2 * P - 1),
    "zbv": (lambda P, M, V: 0.0, lambda P, M: M >= 2 * P - 1),
    "chimera": (lambda P, M, V: (P - 2) / (2 * M + P - 2), lambda P, M: True),
}
COSTS = {"chimera": CostModel(F=1.0, B=1.0)}


def bubble_sizes(name: str):
    for ranks, microbatches in SIZES:
        if name == "chimera" and (ranks % 2 or microbatches % ranks):
            continue
        for per_rank in ((2, 3) if name == "interleaved-1f1b" else (None,)):
            if per_rank and microbatches % max(1, microbatches // ranks):
                continue
            yield ranks, microbatches, per_rank


@pytest.mark.parametrize("name", sorted(BUBBLES))
def test_bubble_rate_closed_forms_hold_exactly_where_the_papers_say(name):
    form, holds = BUBBLES[name]
    for ranks, microbatches, per_rank in bubble_sizes(name):
        extra = {"V": per_rank} if per_rank else {}
        rate = simulate(load(name, ranks, microbatches, **extra), COSTS.get(name)).bubble_rate
        matches = rate == pytest.approx(form(ranks, microbatches, per_rank), abs=1e-9)
        assert matches == holds(ranks, microbatches), (ranks, microbatches, per_rank, rate)


def test_zero_bubble_schedules_beat_1f1b_at_equal_memory_budget():
    for ranks, microbatches in [(4, 8), (8, 16), (6, 24)]:
        rates = {n: simulate(load(n, ranks, microbatches)).bubble_rate for n in ("1f1b", "zb-h1", "zb-h2", "zbv")}
        assert rates["zb-h2"] == rates["zbv"] == 0.0 < rates["zb-h1"] < rates["1f1b"]


def test_chimera_beats_1f1b_when_f_and_b_cost_the_same():
    for ranks, microbatches in [(4, 4), (4, 16), (8, 8), (8, 32)]:
        rates = {n: simulate(load(n, ranks, microbatches), COSTS["chimera"]).bubble_rate for n in ("1f1b", "chimera")}
        assert rates["chimera"] < rates["1f1b"]


def test_v_min_holds_about_a_third_of_1f1b_activations_with_a_packed_steady_state():
    no_weights = MemorySpec(weights=0.0)  # I frees the activations, as the V-Min paper counts them
    for ranks in range(2, 9):
        overheads = set()
        for microbatches in (ranks, 2 * ranks, 4 * ranks):
            timeline = simulate(load("v-min", ranks, microbatches), memory=no_weights)
            # a V stage holds half a rank's layers: two of its activations make one of 1F1B's
            assert max(timeline.peak_memory) / 2 <= ranks // 3 + 1
            one_f_one_b = simulate(load("1f1b", ranks, microbatches))
            assert timeline.bubble_rate < one_f_one_b.bubble_rate
            busy = 6 * microbatches
            overheads.add(round(timeline.bubble_rate * busy / (1 - timeline.bubble_rate), 6))
        # the repeated blocks never meet: the idle time is the warm-up and cool-down's, whatever M
        assert len(overheads) == 1, (ranks, overheads)
