"""verify and the independent oracle agree, on valid schedules and on broken ones.

Schedules come from ``pipeforge.testing``: compute-only, lowered by
``pipeforge.passes.lower``, and with communication written by the strategy
itself (random groups); each valid and mutated, with and without a memory
limit, under both semantics. ``valid`` must always agree, and so must the set
of violation kinds, except where the spec leaves the cascade of a broken
schedule open (see ``comparable``).
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import pipeforge.testing as pt
import pipeforge.verifier as verify_module
from pipeforge.ir import Action, ActionKind, Placement, Schedule, format_grid, programs_from_tokens
from pipeforge.semantics import peer_stage
from tests.verify.oracle import oracle

STRUCTURAL = frozenset({"placement", "duplicate", "missing"})
SMALL = dict(max_ranks=3, max_stages_per_rank=2, max_microbatches=4)
FAST = settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck), database=None)


def comparable(schedule: Schedule, kinds: frozenset[str]) -> bool:
    """Whether the spec fixes every kind this broken schedule has.

    A compute-only schedule is verified as ``lower`` makes it, and the spec does
    not say where ``lower`` puts communication for actions that are missing or
    repeated; then only ``valid`` and the structural kinds are compared. An
    action on the wrong rank is ``placement`` and nothing else (it carries no
    data), so such schedules compare in full, except where the misplaced thing
    is communication written out (its matching is still derived from it) or a
    microbatch on the wrong chain of a bidirectional schedule.
    """
    if "placement" in kinds and (schedule.chains > 1 or (schedule.is_lowered and misplaced_communication(schedule))):
        return False
    return schedule.is_lowered or not kinds & {"duplicate", "missing"}


def misplaced_communication(schedule: Schedule) -> bool:
    def placed(a: Action, rank: int) -> bool:
        stages, peer = range(schedule.stages), peer_stage(a)
        return (0 <= a.chain < schedule.chains and a.stage in stages and peer in stages
                and schedule.rank_of(a.stage, a.chain) == rank != schedule.rank_of(peer, a.chain))

    return any(a.is_comm and not placed(a, rank)
               for rank, program in enumerate(schedule.programs) for step in program for a in step.actions)


def kinds_agree(schedule: Schedule, expected: frozenset[str], got: frozenset[str]) -> bool:
    if comparable(schedule, expected):
        return got == expected
    if "placement" in expected:
        return "placement" in got
    return expected & STRUCTURAL <= got


def agree(schedule: Schedule, semantics: str) -> None:
    """The oracle and verify agree; verify has z3 decide the timing model (``solve=True``), which
    raises ``VerifierDisagreement`` unless z3's verdict is the event pass's."""
    AGREED[schedule.is_lowered] += 1
    report = verify_module.verify(schedule, semantics=semantics, solve=True)
    expected = oracle(schedule, semantics)
    got = frozenset(v.kind for v in report.violations)
    if report.valid == expected.valid and kinds_agree(schedule, expected.kinds, got):
        return
    lines = [f"{semantics}: verify valid={report.valid} kinds={sorted(got)}; "
             f"oracle valid={expected.valid} kinds={sorted(expected.kinds)}",
             f"lowered={schedule.is_lowered} stages={schedule.stages} microbatches={schedule.microbatches} "
             f"placement={schedule.placement.stage_to_rank} memory={schedule.memory}",
             format_grid(schedule), "oracle:", *expected.details, "verify:",
             *(f"{v.kind}: {v.message}" for v in report.violations)]
    pytest.fail("\n".join(lines))


AGREED = {False: 0, True: 0}  # verdicts compared (compute-only, with communication): for the count at the end


def agree_both(schedule: Schedule) -> None:
    """Every semantics (the name is older than the third)."""
    agree(schedule, "rendezvous")
    agree(schedule, "buffered")
    agree(schedule, "nccl")


# ------------------------------------------------------------------ drawn schedules

@FAST
@given(pt.schedules(**SMALL, idle=True, memory=True))
def test_valid_compute_only(schedule):
    assert oracle(schedule).valid
    agree_both(schedule)


@settings(FAST, max_examples=400)
@given(pt.mutated_schedules(**SMALL))
def test_mutated_compute_only(schedule):
    agree_both(schedule)


@settings(FAST, max_examples=120)
@given(pt.mutated_schedules(**SMALL, memory=True, kinds=("swap_steps", "move_action", "drop_action")))
def test_mutated_compute_only_with_memory(schedule):
    agree(schedule, "rendezvous")


@FAST
@given(pt.schedules(**SMALL, comms="random", memory=True))
def test_valid_written_communication(schedule):
    assert oracle(schedule, "rendezvous").valid and oracle(schedule, "buffered").valid
    agree_both(schedule)


@settings(FAST, max_examples=500)
@given(pt.mutated_schedules(**SMALL, comms="random", memory=True))
def test_mutated_written_communication(schedule):
    agree_both(schedule)


@settings(FAST, max_examples=80)
@given(pt.mutated_schedules(max_ranks=4, max_stages_per_rank=3, max_microbatches=6, max_mutations=3,
                            comms="random", idle=True))
def test_larger_mutated_written_communication(schedule):
    agree_both(schedule)


@settings(FAST, max_examples=150)
@given(pt.mutated_schedules(**SMALL, comms="random",
                            kinds=("reorder_receive", "regroup", "swap_steps")))
def test_reordered_communication(schedule):
    agree_both(schedule)


@FAST
@given(pt.schedules(**SMALL, lowered=True))
def test_valid_lowered(schedule):
    agree_both(schedule)


@settings(FAST, max_examples=300)
@given(pt.mutated_schedules(**SMALL, lowered=True))
def test_mutated_lowered(schedule):
    agree_both(schedule)


@settings(FAST, max_examples=100)
@given(pt.mutated_schedules(**SMALL, comms="random", kinds=("swap_steps", "move_action")),
       st.sampled_from([1.0, 1.5, 2.0, 3.0]))
def test_memory_limit_option(schedule, limit):
    report = verify_module.verify(schedule, memory_limit=limit)
    expected = oracle(schedule, memory_limit=limit)
    assert ("memory" in {v.kind for v in report.violations}) == ("memory" in expected.kinds), format_grid(schedule)


# ------------------------------------------------------------------ hand-written cases

def two_rank(rows: list[list[str]], stages: int = 2, microbatches: int = 1) -> Schedule:
    placement = Placement.loop(stages, 2)
    return Schedule("case", 2, stages, microbatches, (placement,), programs_from_tokens(rows))


CASES = [
    # (microbatches, rows, rendezvous kinds, buffered kinds)
    (1, [["0F0", "0SEND_F0", "0RECV_B0", "0B0"], ["1RECV_F0", "1F0", "1B0", "1SEND_B0"]], set(), set()),
    # rank 0 waits for a gradient before sending the activation it comes from
    (1, [["0RECV_B0", "0F0", "0SEND_F0", "0B0"], ["1RECV_F0", "1F0", "1B0", "1SEND_B0"]], {"deadlock"}, {"deadlock"}),
    # 1F1B, receives posted just in time
    (2, [["0F0", "0F1", "0SEND_F0", "0RECV_B0", "0SEND_F1", "0B0", "0RECV_B1", "0B1"],
         ["1RECV_F0", "1F0", "1B0", "1SEND_B0", "1RECV_F1", "1F1", "1B1", "1SEND_B1"]], set(), set()),
    # both ranks post send and receive in one group: rendezvous fires the two groups together
    (2, [["0F0", "0F1", "0SEND_F0", "[0SEND_F1 0RECV_B0]", "0B0", "0RECV_B1", "0B1"],
         ["1RECV_F0", "1F0", "1B0", "[1SEND_B0 1RECV_F1]", "1F1", "1B1", "1SEND_B1"]], set(), set()),
    # the same with both sends first: rendezvous deadlocks, buffered completes
    (2, [["0F0", "0F1", "0SEND_F0", "0SEND_F1", "0RECV_B0", "0B0", "0RECV_B1", "0B1"],
         ["1RECV_F0", "1F0", "1B0", "1SEND_B0", "1RECV_F1", "1F1", "1B1", "1SEND_B1"]], {"deadlock"}, set()),
    # one group receiving both: its component holds two groups of rank 0, so rendezvous never fires it
    (2, [["0F0", "0F1", "0SEND_F0", "0SEND_F1", "0RECV_B0", "0B0", "0RECV_B1", "0B1"],
         ["[1RECV_F0 1RECV_F1]", "1F0", "1B0", "1SEND_B0", "1F1", "1B1", "1SEND_B1"]], {"deadlock"}, set()),
    # a send twice: the second meets no receive; rendezvous waits for it forever, buffered posts it and goes on
    (1, [["0F0", "0SEND_F0", "0SEND_F0", "0RECV_B0", "0B0"], ["1RECV_F0", "1F0", "1B0", "1SEND_B0"]],
     {"duplicate", "deadlock"}, {"duplicate"}),
    # receives crossed: NCCL pairs the first send with the first receive
    (2, [["0F0", "0F1", "0SEND_F0", "0SEND_F1", "0RECV_B0", "0B0", "0RECV_B1", "0B1"],
         ["1RECV_F1", "1RECV_F0", "1F0", "1B0", "1SEND_B0", "1F1", "1B1", "1SEND_B1"]], {"mismatch"}, {"mismatch"}),
    # a receive after the compute that needs it
    (1, [["0F0", "0SEND_F0", "0RECV_B0", "0B0"], ["1F0", "1RECV_F0", "1B0", "1SEND_B0"]], {"order"}, {"order"}),
    # compute-only: consistent, and a cross-rank cycle
    (1, [["0F0", "0B0"], ["1F0", "1B0"]], set(), set()),
    (2, [["0F0", "0B0", "0F1", "0B1"], ["1F1", "1F0", "1B0", "1B1"]], {"deadlock"}, {"deadlock"}),
    # 0B0 before 0F0: an order error, and 0B0 waits on 1B0, which waits on 0F0 through 1F0
    (1, [["0B0", "0F0"], ["1F0", "1B0"]], {"order", "deadlock"}, {"order", "deadlock"}),
    # an order error alone: 1B0 runs before 1F0 on its rank, nothing waits in a circle
    (1, [["0F0", "0B0"], ["1B0", "1F0"]], {"order"}, {"order"}),
]


@pytest.mark.parametrize("microbatches, rows, rendezvous, buffered", CASES)
def test_hand_written_cases(microbatches, rows, rendezvous, buffered):
    schedule = two_rank(rows, microbatches=microbatches)
    assert oracle(schedule, "rendezvous").kinds == rendezvous
    assert oracle(schedule, "buffered").kinds == buffered
    agree_both(schedule)


# (microbatches, rows, rendezvous, nccl, buffered): where the three semantics differ
SEMANTICS_CASES = [
    # one group on rank 0 meets two groups of rank 1: rendezvous never fires it; NCCL progresses each op
    (1, [["0F0", "[0SEND_F0 0RECV_B0]", "0B0"], ["1RECV_F0", "1F0", "1B0", "1SEND_B0"]],
     {"deadlock"}, set(), set()),
    # both ranks send before they receive: only buffered sends get through
    (2, [["0F0", "0F1", "0SEND_F0", "0SEND_F1", "0RECV_B0", "0B0", "0RECV_B1", "0B1"],
         ["1RECV_F0", "1F0", "1B0", "1SEND_B0", "1RECV_F1", "1F1", "1B1", "1SEND_B1"]],
     {"deadlock"}, {"deadlock"}, set()),
    # the two sends in one group, the receiver takes them one group at a time: NCCL is fine
    (2, [["0F0", "0F1", "[0SEND_F0 0SEND_F1]", "0RECV_B0", "0B0", "0RECV_B1", "0B1"],
         ["1RECV_F0", "1F0", "1RECV_F1", "1B0", "1SEND_B0", "1F1", "1B1", "1SEND_B1"]],
     {"deadlock"}, set(), set()),
    # a send that nothing receives: rendezvous and nccl wait forever, buffered posts it and goes on
    (1, [["0F0", "0SEND_F0", "0SEND_F0", "0RECV_B0", "0B0"], ["1RECV_F0", "1F0", "1B0", "1SEND_B0"]],
     {"duplicate", "deadlock"}, {"duplicate", "deadlock"}, {"duplicate"}),
]


@pytest.mark.parametrize("microbatches, rows, rendezvous, nccl, buffered", SEMANTICS_CASES)
def test_cases_where_the_semantics_differ(microbatches, rows, rendezvous, nccl, buffered):
    schedule = two_rank(rows, microbatches=microbatches)
    assert oracle(schedule, "rendezvous").kinds == rendezvous
    assert oracle(schedule, "nccl").kinds == nccl
    assert oracle(schedule, "buffered").kinds == buffered
    agree_both(schedule)


def test_memory_limit_counts_overlap_additions_first():
    from dataclasses import replace

    from pipeforge.ir import MemorySpec

    schedule = Schedule("m", 1, 1, 2, (Placement((0,)),), programs_from_tokens([["0F0", "(0F1;0B0)", "0B1"]]))
    assert oracle(replace(schedule, memory=MemorySpec(limit=2))).valid
    assert oracle(replace(schedule, memory=MemorySpec(limit=1))).kinds == {"memory"}
    agree(replace(schedule, memory=MemorySpec(limit=1)), "rendezvous")


def test_actions_are_what_the_oracle_reads():
    assert Action(0, ActionKind.F, 0) in {a for _, _, a in two_rank([["0F0"], []]).actions()}


# ------------------------------------------------------------------ torch's own schedules

TORCH = [("Schedule1F1B", 4, 8, 1), ("ScheduleGPipe", 4, 8, 1), ("ScheduleInterleaved1F1B", 4, 8, 2),
         ("ScheduleLoopedBFS", 4, 8, 2), ("ScheduleInterleavedZeroBubble", 4, 8, 2),
         ("ScheduleZBVZeroBubble", 4, 8, 2), ("ScheduleDualPipeV", 4, 10, 2)]


@pytest.mark.parametrize("name, ranks, microbatches, per_rank", TORCH)
@pytest.mark.parametrize("form", ["compute_only", "compute_comms"])
def test_torch_schedules(tmp_path, name, ranks, microbatches, per_rank, form):
    """torch's orders as its _dump_csv writes them (Schedule1F1B's pipeline_order in torch 2.13 is wrong)."""
    if per_rank == 1 and form == "compute_comms":
        pytest.skip("single-stage schedules have no lowered order")
    from tests.torch_stages import dump_torch_csv

    from pipeforge.interop.torch_csv import read_csv

    schedule = read_csv(dump_torch_csv(name, ranks, microbatches, per_rank, tmp_path / "t.csv", form))
    assert oracle(schedule).valid == (name != "Schedule1F1B")
    agree_both(schedule)


# ------------------------------------------------------------------ the built-in library, whole and broken

def library_schedules() -> list[Schedule]:
    import pipeforge
    from pipeforge.library import names
    from pipeforge.passes.lower import lower

    small = [pipeforge.load(name, defines={"P": 2, "M": 4}) for name in names()]
    return small + [lower(schedule) for schedule in small]


LIBRARY = library_schedules()


@pytest.mark.parametrize("schedule", LIBRARY, ids=lambda s: f"{s.name}{'-lowered' if s.is_lowered else ''}")
def test_library_schedules(schedule):
    assert oracle(schedule).valid
    agree_both(schedule)


@settings(FAST, max_examples=300)
@given(st.sampled_from(LIBRARY).flatmap(pt.mutations))
def test_mutated_library_schedules(schedule):
    """Chimera brings two chains; others bring memory limits, overlaps and V placements."""
    agree_both(schedule)



# ------------------------------------------------------------------ recompute and offload (R, OFFLOAD, RELOAD)

K = ActionKind


@st.composite
def memory_action_schedules(draw, **options) -> Schedule:
    """A drawn valid schedule with R before the backward of some (stage, microbatch) and OFFLOAD / RELOAD
    around others (``passes.recompute`` / ``passes.offload``), a checkpoint size and a memory limit."""
    from dataclasses import replace

    from pipeforge.ir import MemorySpec
    from pipeforge.passes.recompute import offload, recompute

    schedule = draw(pt.schedules(**SMALL, **options))
    keys = sorted({(a.stage, a.microbatch, a.chain) for _, _, a in schedule.actions() if a.kind is K.F})
    everything = draw(st.sampled_from(["some", "recompute all", "offload all"]))
    if everything == "recompute all":
        schedule = recompute(schedule)
    elif everything == "offload all":
        schedule = offload(schedule)
    else:
        rebuilt = draw(st.sets(st.sampled_from(keys))) if keys else set()
        moved = draw(st.sets(st.sampled_from(keys))) - rebuilt if keys else set()
        schedule = offload(recompute(schedule, rebuilt), moved)
    weights = draw(st.sampled_from([0.0, 0.5, 1.0]))
    limit = draw(st.sampled_from([None, 0.25, 1.0, 1.5, 2.0, 3.0]))
    checkpoint = draw(st.sampled_from([0.0, 0.1, 0.5]))
    return replace(schedule, memory=MemorySpec(limit, weights, checkpoint=checkpoint))


@st.composite
def retargeted(draw, schedule: Schedule) -> Schedule:
    """An R, OFFLOAD or RELOAD made another of the three (or an F or B made one of them)."""
    from dataclasses import replace

    from pipeforge.ir import Step

    spots = [(r, i, k) for r, program in enumerate(schedule.programs) for i, step in enumerate(program)
             if step.is_compute for k, a in enumerate(step.actions)]
    if not spots:
        return schedule
    r, i, k = draw(st.sampled_from(spots))
    step = schedule.programs[r][i]
    kind = draw(st.sampled_from([K.R, K.OFFLOAD, K.RELOAD]))
    actions = list(step.actions)
    actions[k] = actions[k]._replace(kind=kind)
    programs = [list(p) for p in schedule.programs]
    programs[r][i] = Step(tuple(actions), step.overlap, step.span)
    return replace(schedule, programs=tuple(tuple(p) for p in programs))


@settings(FAST, max_examples=150)
@given(memory_action_schedules())
def test_recompute_and_offload_valid(schedule):
    agree_both(schedule)


@settings(FAST, max_examples=400)
@given(memory_action_schedules().flatmap(pt.mutations))
def test_recompute_and_offload_mutated(schedule):
    agree_both(schedule)


@settings(FAST, max_examples=200)
@given(memory_action_schedules(comms="random").flatmap(pt.mutations))
def test_recompute_and_offload_mutated_with_communication(schedule):
    agree_both(schedule)


@settings(FAST, max_examples=300)
@given(memory_action_schedules().flatmap(retargeted))
def test_recompute_and_offload_retargeted(schedule):
    agree_both(schedule)


@settings(FAST, max_examples=500)
@given(memory_action_schedules(), st.sampled_from([0.0, 0.5]), st.sampled_from([0.0, 0.7, 1.5, 3.0]))
def test_the_copy_lane_timing_is_the_oracles(schedule, comm, transfer):
    """simulate's timeline of a schedule that offloads starts every step when the oracle's reading of the
    copy lane rule says (an addition waits for an OFFLOAD only where the limit needs it), and keeps a limit
    the program keeps at every time."""
    from dataclasses import replace

    from pipeforge.ir import CostModel
    from pipeforge.sim import simulate
    from tests.verify.oracle import copy_lane_timing

    costs = CostModel(F=1.0, I=1.0, W=0.5, comm=comm, OFFLOAD=transfer, RELOAD=transfer / 2)
    spec = schedule.memory
    timeline = simulate(replace(schedule, costs=costs), costs)
    assert copy_lane_timing(schedule, timeline.events, comm, spec.weights, spec.checkpoint, spec.limit) == []


@pytest.mark.parametrize("rank0, f3_start", [
    ("0F0 0F1 (0F2;0OFFLOAD0) 0F3 0OFFLOAD1 0RELOAD0 0B0 0RELOAD1 0B1 0B2 0B3", 3.5),  # an OFFLOAD after an F
    ("0F0 0F1 0F2 (0OFFLOAD0;0OFFLOAD1) 0F3 0RELOAD0 0B0 0RELOAD1 0B1 0B2 0B3", 4.0),  # two in one step
])
def test_an_addition_waits_for_the_end_of_an_overlap_steps_offload(rank0, f3_start):
    """At limit 3, F3 holds 3 in program order and 4 with the overlap step's OFFLOAD in flight: it waits
    for the end of that OFFLOAD (the step's last), not for the step's first action (F2 or OFFLOAD0), and
    the rank never holds more than the limit in time."""
    from pipeforge import loads
    from pipeforge.sim import simulate
    from tests.verify.oracle import copy_lane_timing

    schedule = loads(f"""schedule mixed(P = 2, M = 4) {{
        ranks P
        stages P placement loop
        microbatches M
        costs {{ F = 1  I = 1  W = 1  OFFLOAD = 0.5  RELOAD = 0.5 }}
        memory {{ limit = 3 }}
        rank 0 {{ {rank0} }}
        rank 1 {{ 1F0 1B0 1F1 1B1 1F2 1B2 1F3 1B3 }}
    }}
    """)
    assert verify_module.verify(schedule).valid
    timeline = simulate(schedule)
    spec = schedule.memory
    assert copy_lane_timing(schedule, timeline.events, 0.0, spec.weights, spec.checkpoint, spec.limit) == []
    f3 = next(e for e in timeline.events if str(e.actions[0]) == "0F3")
    assert f3.start == f3_start and timeline.timed_peak_memory[0] == 3.0
