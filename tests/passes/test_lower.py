"""lower: compute-only in, send/recv groups and REDUCE_GRAD out, deadlock-free when the order is consistent."""

from __future__ import annotations

import random

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeforge.errors import Span
from pipeforge.ir import ActionKind, Placement, Schedule, Step, format_grid, parse_step, programs_from_tokens
from pipeforge.passes.lower import lower, lower_with_origins
from pipeforge.verifier import verify
from tests.sim.sim_orders import inputs_done

HYPOTHESIS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def schedule_of(rows: list[list[str]], ranks: int, stages: int, microbatches: int,
                placement: Placement | None = None) -> Schedule:
    placement = placement or Placement.loop(stages, ranks)
    return Schedule("t", ranks, stages, microbatches, (placement,), programs_from_tokens(rows))


def tokens(schedule: Schedule) -> list[list[str]]:
    return [[str(step) for step in program] for program in schedule.programs]


ONE_F_ONE_B = [["0F0", "0F1", "0B0", "0B1"], ["1F0", "1B0", "1F1", "1B1"]]


def test_one_f_one_b_on_two_ranks_lowers_to_the_expected_groups():
    lowered = lower(schedule_of(ONE_F_ONE_B, 2, 2, 2))
    assert tokens(lowered) == [
        ["0F0", "0SEND_F0", "0F1", "0SEND_F1", "0RECV_B0", "0B0", "0RECV_B1", "0B1", "0REDUCE_GRAD"],
        ["1RECV_F0", "1F0", "1RECV_F1", "1B0", "1SEND_B0", "1F1", "1B1", "1SEND_B1", "1REDUCE_GRAD"],
    ]


def test_sends_and_receives_of_one_round_share_a_group():
    # rank 1 sends 1B0's gradient while rank 0 sends 0F1's output: both in the round's groups
    rows = [["0F0", "0F1", "0B0", "0B1"], ["1F0", "1B0", "1F1", "1B1"]]
    lowered = lower(schedule_of(rows, 2, 2, 2))
    assert verify(lowered).valid and verify(lowered, semantics="buffered").valid


def test_already_lowered_input_is_returned_unchanged():
    once = lower(schedule_of(ONE_F_ONE_B, 2, 2, 2))
    assert lower(once) is once


def test_same_rank_adjacent_stages_get_no_communication():
    placement = Placement((0, 0, 1, 1))
    rows = [["0F0", "1F0", "1B0", "0B0"], ["2F0", "3F0", "3B0", "2B0"]]
    lowered = lower(schedule_of(rows, 2, 4, 1, placement))
    comms = {str(a) for _, _, a in lowered.actions() if a.is_comm}
    assert comms == {"1SEND_F0", "2RECV_F0", "2SEND_B0", "1RECV_B0"}
    assert verify(lowered).valid


def test_reduce_grad_follows_the_last_backward_of_each_stage_on_its_rank():
    rows = [["0F0", "2F0", "2I0", "0F1", "2W0", "0B0", "2F1", "2B1", "0B1"],
            ["1F0", "3F0", "3B0", "1B0", "1F1", "3F1", "3B1", "1B1"]]
    lowered = lower(schedule_of(rows, 2, 4, 2))
    for program in lowered.programs:
        for position, step in enumerate(program):
            for action in step.actions:
                if action.kind is ActionKind.REDUCE_GRAD:
                    later = [a for s in program[position + 1:] for a in s.actions
                             if a.stage == action.stage and a.kind in (ActionKind.B, ActionKind.W)]
                    assert not later
    grads = sorted(str(a) for _, _, a in lowered.actions() if a.kind is ActionKind.REDUCE_GRAD)
    assert grads == ["0REDUCE_GRAD", "1REDUCE_GRAD", "2REDUCE_GRAD", "3REDUCE_GRAD"]
    assert verify(lowered).valid


def test_receives_come_before_the_compute_that_needs_them():
    lowered = lower(schedule_of(ONE_F_ONE_B, 2, 2, 2))
    for program in lowered.programs:
        seen: set[str] = set()
        for step in program:
            for action in step.actions:
                if action.kind is ActionKind.F and action.stage > 0:
                    assert f"{action.stage}RECV_F{action.microbatch}" in seen
            seen.update(str(a) for a in step.actions)


def test_inserted_steps_take_the_span_of_the_compute_step_they_serve():
    rows = programs_from_tokens(ONE_F_ONE_B)
    spanned = tuple(
        tuple(Step(step.actions, step.overlap, Span("x.pipe", rank + 1, 10 * i + 1)) for i, step in enumerate(program))
        for rank, program in enumerate(rows)
    )
    schedule = Schedule("t", 2, 2, 2, (Placement.loop(2, 2),), spanned)
    lowered = lower_with_origins(schedule)
    for rank, program in enumerate(lowered.schedule.programs):
        for step, origin in zip(program, lowered.origins[rank]):
            assert step.span == schedule.programs[rank][origin].span
            assert step.span is not None


def test_overlap_steps_are_lowered_and_verify():
    # a DualPipeV-like corner: rank 0 holds stages 0 and 3 (V placement), overlapping F and B
    rows = [["0F0", "0F1", "3F0", "(3B0;0F2)", "3F1", "3B1", "3F2", "(3B2;0B0)", "0B1", "0B2"],
            ["1F0", "2F0", "1F1", "2B0", "2F1", "1B0", "2B1", "1F2", "2F2", "2B2", "1B1", "1B2"]]
    schedule = schedule_of(rows, 2, 4, 3, Placement.v(4, 2))
    report = verify(schedule)
    assert report.valid, report.render()
    assert verify(lower(schedule), semantics="buffered").valid


def test_idle_slots_are_dropped_and_origins_count_them():
    rows = [["0F0", "_", "0B0"], ["_", "1F0", "1B0"]]
    lowered = lower_with_origins(schedule_of(rows, 2, 2, 1))
    assert all(not step.is_idle for program in lowered.schedule.programs for step in program)
    assert lowered.origins[1][lowered.schedule.programs[1].index(parse_step("1F0"))] == 1


def test_torch_cycle_lowers_to_a_deadlock_on_the_compute_steps():
    rows = [["0F0", "2F0", "2B0", "0B0"], ["3F0", "1F0", "3B0", "1B0"]]
    report = verify(schedule_of(rows, 2, 4, 1))
    assert report.kinds() == {"deadlock"}
    (deadlock,) = report.violations
    assert [(hop.rank, hop.step, hop.step_text) for hop in deadlock.cycle] == [(0, 1, "2F0"), (1, 0, "3F0")]


# --- properties ----------------------------------------------------------------------------


@st.composite
def consistent_orders(draw, max_ranks: int = 4, max_microbatches: int = 4) -> Schedule:
    """A compute order drawn as a random global execution, projected onto the ranks."""
    ranks = draw(st.integers(1, max_ranks))
    per_rank = draw(st.integers(1, 2))
    stages = ranks * per_rank
    placement = draw(st.sampled_from([Placement.loop(stages, ranks), Placement.v(stages, ranks)]))
    # bidirectional now and then: chain 1 runs the stages the other way round (Chimera)
    placements = (placement,) if not draw(st.booleans()) else \
        (placement, Placement(tuple(reversed(placement.stage_to_rank))))
    microbatches = draw(st.integers(1, max_microbatches))
    rng = random.Random(draw(st.integers(0, 2**32 - 1)))
    split = {(s, m): rng.random() < 0.4 for s in range(stages) for m in range(microbatches)}
    done: set[tuple[str, int, int]] = set()
    rows: list[list[str]] = [[] for _ in range(ranks)]
    while True:
        ready = [a for a in all_actions(stages, microbatches, split) if a not in done and inputs_done(a, done, stages)]
        if not ready:
            break
        kind, s, m = rng.choice(ready)
        done.add((kind, s, m))
        chain = m % len(placements)
        rows[placements[chain].rank_of(s)].append(f"{s}{kind}{m}" + (f"@{chain}" if chain else ""))
    return Schedule("t", ranks, stages, microbatches, placements, programs_from_tokens(rows))


def all_actions(stages: int, microbatches: int, split: dict) -> list[tuple[str, int, int]]:
    found = []
    for s in range(stages):
        for m in range(microbatches):
            found.append(("F", s, m))
            found.extend([("I", s, m), ("W", s, m)] if split[(s, m)] else [("B", s, m)])
    return found


@HYPOTHESIS
@given(consistent_orders())
def test_consistent_compute_orders_lower_to_valid_schedules(schedule):
    lowered = lower(schedule)
    for semantics in ("rendezvous", "buffered"):
        report = verify(lowered, semantics=semantics)
        assert report.valid, f"{semantics}\n{format_grid(lowered)}\n{report.render()}"


def split_groups(schedule: Schedule) -> Schedule:
    """Each op of each group posted alone, as a torch CSV (which has no groups) reads it."""
    def split(program):
        for step in program:
            yield from (Step((action,)) for action in step.actions) if step.is_group else (step,)

    programs = tuple(tuple(split(program)) for program in schedule.programs)
    return Schedule(schedule.name, schedule.ranks, schedule.stages, schedule.microbatches, schedule.placements,
                    programs)


@HYPOTHESIS
@given(consistent_orders())
def test_lowered_groups_split_into_single_ops_still_do_not_deadlock(schedule):
    split = split_groups(lower(schedule))
    report = verify(split)
    assert report.valid, f"{format_grid(split)}\n{report.render()}"


@HYPOTHESIS
@given(consistent_orders(), st.randoms(use_true_random=False))
def test_shuffled_orders_never_lower_to_a_mismatch(schedule, rng):
    """Whatever the compute order, lower keeps NCCL's FIFO matching right: only order or deadlock remain."""
    programs = [list(program) for program in schedule.programs]
    for program in programs:
        rng.shuffle(program)
    shuffled = Schedule("t", schedule.ranks, schedule.stages, schedule.microbatches, schedule.placements,
                        tuple(map(tuple, programs)))
    report = verify(shuffled)
    assert report.kinds() <= {"order", "deadlock"}, report.render()
    assert verify(lower(shuffled)).kinds() == report.kinds()


def test_pipeforge_testing_valid_schedules_lower_to_valid(tmp_path):
    import pipeforge.testing as pt

    @HYPOTHESIS
    @given(pt.schedules(max_ranks=4, lowered=True))
    def check(schedule):
        assert verify(schedule).valid and verify(schedule, semantics="buffered").valid

    check()


def test_written_stage_only_steps_pass_through_and_are_not_doubled():
    rows = [["0UNSHARD", "0F0", "0B0", "0REDUCE_GRAD", "0RESHARD"], ["1F0", "1B0"]]
    lowered = lower(schedule_of(rows, 2, 2, 1))
    assert tokens(lowered)[0] == ["0UNSHARD", "0F0", "0SEND_F0", "0RECV_B0", "0B0", "0REDUCE_GRAD", "0RESHARD"]
    assert tokens(lowered)[1] == ["1RECV_F0", "1F0", "1B0", "1SEND_B0", "1REDUCE_GRAD"]
    assert verify(lowered).valid


def test_lowering_grows_linearly_in_the_ranks():
    """1F1B with two microbatches on 500 and on 8000 ranks: 16 times the steps, about 16 times the CPU
    time (was about 95 times: each rank read every stage's owner and every rank's reduce-grad places, and
    `pipeforge verify 1f1b -D P=100000 -D M=2` ran for minutes). The collector is paused while timing,
    as the command line pauses it (its collections grow with the heap, not with lower's work)."""
    import gc
    import time

    from pipeforge import load

    def cpu(schedule: Schedule) -> float:
        best = float("inf")
        for _ in range(3):
            gc.disable()
            try:
                started = time.process_time()
                lower(schedule)
                best = min(best, time.process_time() - started)
            finally:
                gc.enable()
        return best

    small, large = (load("1f1b", defines={"P": ranks, "M": 2}) for ranks in (500, 8000))
    assert cpu(large) < 40 * cpu(small)  # 14 here; quadratic: 95
