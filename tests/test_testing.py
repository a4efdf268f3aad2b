"""pipeforge.testing: the strategies draw what they promise."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import pipeforge.testing as pt
from pipeforge.ir import ActionKind, Placement, Schedule, format_grid, programs_from_tokens
from tests.verify.oracle import oracle  # the independent checker of docs/semantics.md

QUICK = settings(max_examples=80, deadline=None, suppress_health_check=list(HealthCheck), database=None)


def compute_actions(schedule: Schedule) -> list:
    return [a for _, _, a in schedule.actions() if a.is_compute]


@QUICK
@given(pt.schedules(max_ranks=4, idle=True, memory=True))
def test_drawn_compute_only_schedules_are_valid_and_complete(schedule):
    assert not schedule.is_lowered
    result = oracle(schedule)
    assert result.valid, result.details
    forwards = Counter((a.stage, a.microbatch) for a in compute_actions(schedule) if a.kind is ActionKind.F)
    assert forwards == Counter({(s, m): 1 for s in range(schedule.stages) for m in range(schedule.microbatches)})


@QUICK
@given(pt.schedules(max_ranks=4, comms="random", memory=True))
def test_drawn_written_communication_is_valid_under_both_semantics(schedule):
    for semantics in ("rendezvous", "buffered"):
        result = oracle(schedule, semantics)
        assert result.valid, (semantics, result.details, format_grid(schedule))


@QUICK
@given(pt.schedules(max_ranks=3, lowered=True))
def test_lowered_option_uses_the_lower_pass(schedule):
    from pipeforge.passes.lower import lower

    assert lower(schedule) == schedule  # already lowered: lower leaves it alone
    assert schedule.is_lowered or all(
        schedule.rank_of(s) == schedule.rank_of(s + 1) for s in range(schedule.stages - 1))


@pytest.mark.parametrize("style", ["loop", "v", "explicit"])
def test_placement_shapes(style):
    @settings(max_examples=30, deadline=None, database=None)
    @given(pt.schedules(min_ranks=3, max_ranks=3, max_stages_per_rank=2, placements=(style,)))
    def check(schedule):
        stages = schedule.stages
        if style == "loop":
            assert schedule.placement == Placement.loop(stages, 3)
        if style == "v":
            assert schedule.placement == Placement.v(stages, 3)
        assert all(0 <= r < 3 for r in schedule.placement.stage_to_rank)

    check()


@pytest.mark.slow  # counts what 150 examples reach: too few examples would fail it, so not in the fast tier
def test_strategies_reach_overlaps_splits_groups_and_reduce_grad():
    seen: Counter = Counter()

    @settings(max_examples=150, deadline=None, database=None)
    @given(pt.schedules(max_ranks=3, comms="random"))
    def look(schedule):
        steps = [step for _, _, step in schedule.steps()]
        seen["overlap"] += any(step.overlap for step in steps)
        seen["group"] += any(step.is_group and len(step.actions) > 1 for step in steps)
        seen["split"] += any(a.kind is ActionKind.W for _, _, a in schedule.actions())
        seen["reduce_grad"] += any(a.kind is ActionKind.REDUCE_GRAD for _, _, a in schedule.actions())
        seen["several stages"] += any(len(schedule.stages_on(r)) > 1 for r in range(schedule.ranks))

    look()
    assert all(seen[k] > 0 for k in ("overlap", "group", "split", "reduce_grad", "several stages")), seen


def test_no_split_and_no_overlap_options():
    @settings(max_examples=40, deadline=None, database=None)
    @given(pt.schedules(split_backward=False, overlap=False))
    def check(schedule):
        assert not any(step.overlap for _, _, step in schedule.steps())
        assert not any(a.kind in (ActionKind.I, ActionKind.W) for _, _, a in schedule.actions())

    check()


ONE_F_ONE_B = Schedule("1f1b", 2, 2, 2, (Placement.loop(2, 2),), programs_from_tokens([
    ["0F0", "0SEND_F0", "0F1", "0SEND_F1", "0RECV_B0", "0B0", "0RECV_B1", "0B1"],
    ["1RECV_F0", "1F0", "1B0", "1SEND_B0", "1RECV_F1", "1F1", "1B1", "1SEND_B1"],
]))


@pytest.mark.parametrize("kind", pt.MUTATIONS)
def test_each_mutation_changes_the_schedule(kind):
    schedule = ONE_F_ONE_B  # it has receives, and adjacent groups to merge (1SEND_B0 1RECV_F1)

    @settings(max_examples=25, deadline=None, database=None)
    @given(pt.mutations(schedule, (kind,)))
    def check(mutated):
        assert mutated != schedule
        assert mutated.ranks == schedule.ranks and mutated.placements == schedule.placements

    check()


@pytest.mark.slow  # counts what 150 examples reach: too few examples would fail it, so not in the fast tier
def test_mutations_break_most_schedules():
    verdicts: Counter = Counter()

    @settings(max_examples=150, deadline=None, database=None)
    @given(pt.mutated_schedules(max_ranks=3, comms="random", max_mutations=1))
    def look(schedule):
        verdicts[oracle(schedule).valid] += 1

    look()
    assert verdicts[False] > verdicts[True] > 0, verdicts


def test_bad_options_are_refused():
    with pytest.raises(ValueError, match="comms='nccl'"):
        pt.schedules(comms="nccl")
    with pytest.raises(ValueError, match="placements"):
        pt.schedules(placements=("zigzag",))
    with pytest.raises(ValueError, match="unknown mutations"):
        pt.mutations(ONE_F_ONE_B, ("shuffle",))


EMPTY = Schedule("empty", 1, 1, 1, (Placement((0,)),), ((),))


@settings(max_examples=5, database=None)
@given(st.just(EMPTY).flatmap(pt.mutations))
def test_mutation_of_an_empty_schedule_is_the_schedule(mutated):
    assert mutated == EMPTY
