"""verify: one hand-made case per violation kind, and the known cases of torch's schedules."""

from __future__ import annotations

from dataclasses import replace

import pytest

from pipeforge.errors import Span
from pipeforge.ir import MemorySpec, Placement, Schedule, Step, programs_from_tokens
from pipeforge.verifier import KINDS, verify


def schedule_of(rows, ranks=2, stages=2, microbatches=1, placement=None, chains=None) -> Schedule:
    placements = chains or (placement or Placement.loop(stages, ranks),)
    return Schedule("case", ranks, stages, microbatches, placements, programs_from_tokens(rows))


def places(report, kind):
    return [(v.rank, v.step) for v in report.violations if v.kind == kind]


LOWERED_OK = [["0F0", "0SEND_F0", "0RECV_B0", "0B0"], ["1RECV_F0", "1F0", "1B0", "1SEND_B0"]]

# (name, rows, stages, microbatches, the kinds verify reports, where the first of them is)
CASES = [
    ("valid, written", LOWERED_OK, 2, 1, set(), None),
    ("valid, compute-only", [["0F0", "0B0"], ["1F0", "1B0"]], 2, 1, set(), None),
    # stage 1 belongs to rank 1: its actions on rank 0 are placement errors, and carry nothing (so 0B0's
    # need of a receive from stage 1 is not an order error: stage 1's backward is not where it belongs)
    ("placement: 1F0 on rank 0", [["0F0", "1F0", "1B0", "0B0"], []], 2, 1, {"placement"}, (0, 1)),
    ("placement: microbatch out of range", [["0F0", "0F1", "0B0"], ["1F0", "1B0"]], 2, 1, {"placement"}, (0, 1)),
    ("placement: stage out of range", [["0F0", "0B0", "5F0"], ["1F0", "1B0"]], 2, 1, {"placement"}, (0, 2)),
    ("duplicate F", [["0F0", "0F0", "0B0"], ["1F0", "1B0"]], 2, 1, {"duplicate"}, (0, 1)),
    ("duplicate: B and I", [["0F0", "0B0", "0I0", "0W0"], ["1F0", "1B0"]], 2, 1, {"duplicate"}, (0, 2)),
    ("placement: a send to a stage that does not exist",
     [["0F0", "0SEND_F0", "0RECV_B0", "0B0", "0SEND_B0"], ["1RECV_F0", "1F0", "1B0", "1SEND_B0"]], 2, 1,
     {"placement", "deadlock"}, (0, 4)),  # its peer stage -1 exists nowhere: nothing meets it, it blocks
    ("duplicate: a receive written twice",
     [["0F0", "0SEND_F0", "0RECV_B0", "0B0"], ["1RECV_F0", "1RECV_F0", "1F0", "1B0", "1SEND_B0"]], 2, 1,
     {"duplicate", "deadlock"}, (1, 1)),
    ("missing backward", [["0F0"], ["1F0", "1B0"]], 2, 1, {"missing"}, (0, None)),
    ("missing W", [["0F0", "0I0"], ["1F0", "1B0"]], 2, 1, {"missing"}, (0, None)),
    ("missing I: a W beside a B", [["0F0", "0B0", "0W0"], ["1F0", "1B0"]], 2, 1,
     {"duplicate", "missing"}, (0, 2)),  # 0W0 lacks 0I0: missing, not also an order error
    # 1F0 lacks its receive: missing (not also order); 0SEND_F0 then meets nothing and blocks
    ("missing receive", [["0F0", "0SEND_F0", "0RECV_B0", "0B0"], ["1F0", "1B0", "1SEND_B0"]], 2, 1,
     {"missing", "deadlock"}, (1, None)),
    ("order: B before F", [["0B0", "0F0"], ["1F0", "1B0"]], 2, 1, {"order", "deadlock"}, (0, 0)),
    ("order: W before I", [["0F0", "0W0", "0I0"], ["1F0", "1B0"]], 2, 1, {"order"}, (0, 1)),
    ("order: receive after its compute",
     [["0F0", "0SEND_F0", "0RECV_B0", "0B0"], ["1F0", "1RECV_F0", "1B0", "1SEND_B0"]], 2, 1, {"order"}, (1, 0)),
    ("mismatch: receives crossed",
     [["0F0", "0F1", "0SEND_F0", "0SEND_F1", "0RECV_B0", "0B0", "0RECV_B1", "0B1"],
      ["1RECV_F1", "1RECV_F0", "1F0", "1B0", "1SEND_B0", "1F1", "1B1", "1SEND_B1"]], 2, 2, {"mismatch"}, (0, 2)),
    ("deadlock: a gradient awaited before the activation is sent",
     [["0RECV_B0", "0F0", "0SEND_F0", "0B0"], ["1RECV_F0", "1F0", "1B0", "1SEND_B0"]], 2, 1, {"deadlock"}, (0, 0)),
]


@pytest.mark.parametrize("name, rows, stages, microbatches, kinds, first", CASES, ids=[c[0] for c in CASES])
def test_case_table(name, rows, stages, microbatches, kinds, first):
    report = verify(schedule_of(rows, stages=stages, microbatches=microbatches))
    assert report.kinds() == kinds, report.render()
    assert report.valid == (not kinds)
    if first is not None:
        assert (report.violations[0].rank, report.violations[0].step) == first
    if report.valid:
        assert report.certified


def test_every_kind_but_syntax_has_a_case():
    covered = set().union(*(case[4] for case in CASES)) | {"memory"}
    assert covered == set(KINDS) - {"syntax"}


def test_memory_limit_reports_the_first_step_over_it():
    schedule = schedule_of([["0F0", "0F1", "0F2", "0B0", "0B1", "0B2"]], ranks=1, stages=1, microbatches=3)
    assert verify(schedule).valid
    assert verify(replace(schedule, memory=MemorySpec(limit=3))).valid
    report = verify(replace(schedule, memory=MemorySpec(limit=2)))
    assert report.kinds() == {"memory"} and places(report, "memory") == [(0, 2)]
    assert verify(schedule, memory_limit=2).kinds() == {"memory"}
    assert verify(replace(schedule, memory=MemorySpec(limit=2)), memory_limit=3).valid


def test_memory_counts_an_overlap_step_after_its_additions():
    schedule = schedule_of([["0F0", "(0F1;0B0)", "0B1"]], ranks=1, stages=1, microbatches=2)
    assert verify(schedule, memory_limit=2).valid
    assert places(verify(schedule, memory_limit=1), "memory") == [(0, 1)]


def test_a_violation_carries_the_location_of_its_step():
    rows = programs_from_tokens([["0F0", "0F0", "0B0"], ["1F0", "1B0"]])
    spanned = tuple(tuple(Step(s.actions, s.overlap, Span("f.pipe", 3 + r, 5 + 4 * i)) for i, s in enumerate(p))
                    for r, p in enumerate(rows))
    schedule = Schedule("case", 2, 2, 1, (Placement.loop(2, 2),), spanned)
    (violation,) = verify(schedule).violations
    assert violation.to_json() == {"kind": "duplicate", "message": violation.message, "rank": 0, "step": 1,
                                   "location": "f.pipe:3:9"}


# --- deadlocks: the cycle hop by hop, the z3 core, both semantics -----------------------------

def facing_sends() -> Schedule:
    # rank 0 blocks in 0SEND_F1 while rank 1 blocks in 0SEND_B0's partner 1SEND_B0: two sends facing
    rows = [["0F0", "0F1", "0SEND_F0", "0SEND_F1", "0RECV_B0", "0B0", "0RECV_B1", "0B1"],
            ["1RECV_F0", "1F0", "1B0", "1SEND_B0", "1RECV_F1", "1F1", "1B1", "1SEND_B1"]]
    return schedule_of(rows, microbatches=2)


def test_blocking_sends_facing_each_other_deadlock_under_rendezvous_only():
    schedule = facing_sends()
    report = verify(schedule)
    assert report.kinds() == {"deadlock"}
    (deadlock,) = report.violations
    assert [(hop.rank, hop.step, hop.waits_for, hop.peer) for hop in deadlock.cycle] == [
        (0, 3, "1RECV_F1", 1), (1, 3, "0RECV_B0", 0)]
    assert deadlock.message.startswith("rank 0 step 3 (0SEND_F1) waits for 1RECV_F1 from rank 1, "
                                       "which waits at step 3 (1SEND_B0) for 0RECV_B0 from rank 0")
    assert deadlock.core and len(deadlock.core) <= 10
    assert verify(schedule, semantics="buffered").valid


def test_torch_validate_schedule_accepts_a_cross_rank_cycle_that_verify_rejects():
    from torch.distributed.pipelining import schedules
    rows = [["0F0", "2F0", "2B0", "0B0"], ["3F0", "1F0", "3B0", "1B0"]]
    torch_actions = {rank: [schedules._Action.from_str(a) for a in row] for rank, row in enumerate(rows)}
    assert schedules._validate_schedule(torch_actions, 2, 4, 1) == {0: 0, 2: 0, 3: 1, 1: 1}
    report = verify(schedule_of(rows, stages=4))
    assert report.kinds() == {"deadlock"}
    (deadlock,) = report.violations
    assert [(hop.rank, hop.step, hop.step_text, hop.peer) for hop in deadlock.cycle] == [
        (0, 1, "2F0", 1), (1, 0, "3F0", 0)]
    assert "rank 0 step 1 (2F0) waits for 1SEND_F0 from rank 1, which waits at step 0 (3F0) for 2SEND_F0" \
        in deadlock.message
    assert any(line.startswith("rendezvous:") for line in deadlock.core)
    assert "3F0*" in deadlock.grid and "2F0*" in deadlock.grid
    assert verify(schedule_of(rows, stages=4), semantics="buffered").kinds() == {"deadlock"}


def test_a_rendezvous_needing_two_steps_of_one_rank_says_so():
    rows = [["0F0", "[0SEND_F0 0RECV_B0]", "0B0"], ["1RECV_F0", "1F0", "1B0", "1SEND_B0"]]
    report = verify(schedule_of(rows))
    assert report.kinds() == {"deadlock"}
    message = report.violations[0].message
    assert message.startswith("rank 0 step 1 ([0SEND_F0 0RECV_B0]) waits for 1SEND_B0 from rank 1, "
                              "which waits at step 0 (1RECV_F0) for 0SEND_F0 from rank 0, posted there at step 1")
    assert verify(schedule_of(rows), semantics="buffered").valid
    assert verify(schedule_of(rows), semantics="nccl").valid


def test_an_unmatched_receive_ends_the_chain_at_a_finished_rank():
    rows = [["0F0", "0SEND_F0", "0RECV_B0", "0B0"], ["1RECV_F0", "1F0", "1B0"]]
    for semantics in ("rendezvous", "buffered"):
        report = verify(schedule_of(rows), semantics=semantics)
        deadlock = next(v for v in report.violations if v.kind == "deadlock")
        assert deadlock.cycle[-1].peer_finished and deadlock.cycle[0].rank == 0
        assert "has finished" in deadlock.message


def test_a_group_matched_twice_on_one_rank_never_fires_under_rendezvous():
    rows = [["0F0", "0F1", "0SEND_F0", "0SEND_F1", "0RECV_B0", "0B0", "0RECV_B1", "0B1"],
            ["[1RECV_F0 1RECV_F1]", "1F0", "1B0", "1SEND_B0", "1F1", "1B1", "1SEND_B1"]]
    schedule = schedule_of(rows, microbatches=2)
    assert verify(schedule).kinds() == {"deadlock"}
    assert verify(schedule, semantics="buffered").valid


def test_render_of_a_valid_schedule_names_the_z3_certificate():
    report = verify(schedule_of(LOWERED_OK))
    assert report.solved and report.render().startswith("valid: decided by z3 (free start times) (8 steps, ")
    report = verify(schedule_of(LOWERED_OK), solve=False)
    assert not report.solved and report.render().startswith("valid: certificate checked by z3 (8 steps, ")
    assert verify(schedule_of(LOWERED_OK), certify=False).render().startswith("valid: checked without")


def test_render_of_a_deadlock_shows_hops_and_the_grid():
    text = verify(facing_sends()).render()
    assert "deadlock: rank 0 step 3 (0SEND_F1)" in text
    assert "  rank 1 step 3 (1SEND_B0) waits for 0RECV_B0 from rank 0" in text
    assert "0SEND_F1*" in text and "1SEND_B0*" in text


def test_json_is_the_design_contract_plus_what_established_each_kind():
    report = verify(facing_sends()).to_json()
    assert set(report) == {"valid", "violations", "stats", "semantics", "solved", "established"}
    assert report["solved"] and report["established"]["deadlock"].startswith("z3: decided")
    assert set(report["established"]) == set(KINDS) - {"syntax"}
    assert verify(facing_sends(), solve=False).to_json()["established"]["deadlock"].startswith("event pass")
    assert set(report["stats"]) == {"ranks", "stages", "microbatches", "actions", "seconds"}
    assert all(set(v) == {"kind", "message", "rank", "step", "location"} for v in report["violations"])
    assert report["stats"]["actions"] == 16


def test_unknown_semantics_is_a_usage_error():
    from pipeforge.errors import UsageError

    with pytest.raises(UsageError):
        verify(schedule_of(LOWERED_OK), semantics="eager")


# --- torch's own schedules -----------------------------------------------------------------


def torch_schedule(name: str, ranks: int, microbatches: int, per_rank: int = 1) -> Schedule:
    from tests import torch_stages
    order = torch_stages.torch_pipeline_order(name, ranks, microbatches, per_rank)
    rows = [[cell or "_" for cell in order[rank]] for rank in range(ranks)]
    stages = ranks * per_rank
    placement = Placement.v(stages, ranks) if name in torch_stages.V_SCHEDULES else Placement.loop(stages, ranks)
    return schedule_of(rows, ranks, stages, microbatches, placement)


def test_torch_schedule_1f1b_pipeline_order_is_rejected():
    """torch 2.13's Schedule1F1B.pipeline_order (what _dump_csv writes; not what step() runs, see
    test_torch_1f1b.py) never forwards microbatch 0 on the last rank and forwards one that does not exist."""
    report = verify(torch_schedule("Schedule1F1B", 4, 8))
    assert not report.valid
    messages = [v.message for v in report.violations]
    assert any(v.kind == "missing" and v.rank == 3 and "no forward 3F0" in v.message for v in report.violations)
    assert any(v.kind == "placement" and v.rank == 3 and "microbatch 8 is outside 0..7" in m
               for v, m in zip(report.violations, messages))


@pytest.mark.parametrize("name, ranks, microbatches, per_rank", [
    ("ScheduleGPipe", 4, 8, 1), ("ScheduleInterleaved1F1B", 4, 8, 2), ("ScheduleLoopedBFS", 4, 8, 2),
    ("ScheduleInterleavedZeroBubble", 4, 8, 2), ("ScheduleZBVZeroBubble", 4, 8, 2)])
def test_torch_multi_stage_orders_are_valid(name, ranks, microbatches, per_rank):
    report = verify(torch_schedule(name, ranks, microbatches, per_rank))
    assert report.valid and report.certified, report.render()


# ------------------------------------------------------------------ kinds that name the cause

@pytest.mark.parametrize("rows", [
    [["0F0", "1F0", "0B0"], ["1B0"]],  # 1F0 on rank 0: rank 1's 1B0 then lacks it, but that is derived
    [["0F0", "0B0"], ["1F0", "1B0", "0B0"]],  # 0B0 again, on rank 1
    [["0F0", "1B0", "0B0"], ["1F0"]],  # the last stage's backward on the first rank
])
def test_an_action_on_the_wrong_rank_is_placement_and_nothing_derived(rows):
    for semantics in ("rendezvous", "nccl", "buffered"):
        assert verify(schedule_of(rows), semantics=semantics).kinds() <= {"placement", "duplicate"}


def test_a_missing_producer_is_missing_only():
    assert verify(schedule_of([["0B0"], ["1F0", "1B0"]])).kinds() == {"missing"}  # 1F0's input never comes
    assert verify(schedule_of([["0F0", "0B0"], ["1B0"]])).kinds() == {"missing"}  # 1B0 without 1F0
    written = [["0F0", "0SEND_F0", "0RECV_B0", "0B0"], ["1F0", "1B0", "1SEND_B0"]]  # 1RECV_F0 never posted
    assert "order" not in verify(schedule_of(written)).kinds()


# ------------------------------------------------------------------ hops through groups

def test_a_hop_names_the_group_a_rendezvous_passes_through():
    rows = [["0F0", "0F1", "0SEND_F0", "0SEND_F1", "0RECV_B0", "0B0", "0RECV_B1", "0B1"],
            ["1RECV_F0", "1F0", "1B0", "[1SEND_B0 1RECV_F1]", "1F1", "1B1", "1SEND_B1"]]
    report = verify(schedule_of(rows, microbatches=2))
    (violation,) = report.violations
    assert [(hop.rank, hop.step) for hop in violation.cycle] == [(0, 3), (1, 3)]
    assert "posted there at step 3 in [1SEND_B0 1RECV_F1]" in violation.message
    assert "which waits at step 3 ([1SEND_B0 1RECV_F1]) for 0RECV_B0 from rank 0" in violation.message


def test_a_cycle_closing_at_a_group_passed_through_stops_there():
    rows = [["0F0", "[0SEND_F0 0RECV_B0]", "0B0"], ["1RECV_F0", "1F0", "1B0", "1SEND_B0"]]
    (violation,) = verify(schedule_of(rows)).violations
    assert [(hop.rank, hop.step, hop.posted) for hop in violation.cycle] == [(0, 1, False), (1, 0, True)]
    assert 2 <= len(violation.core) <= 6


# ------------------------------------------------------------------ z3 decides, and must agree

def test_z3_decides_with_free_start_times_by_default_on_small_schedules():
    assert verify(schedule_of(LOWERED_OK)).solved
    assert not verify(schedule_of(LOWERED_OK), solve=False).solved
    assert verify(facing_sends()).solved


def test_an_event_pass_that_disagrees_with_z3_is_an_internal_error(monkeypatch):
    """Fault injection: an event pass that calls a deadlocked schedule valid (its timing ignores
    the cycle) must not yield a verdict; z3, deciding, finds the model unsatisfiable."""
    import pipeforge.verifier as verify_package
    from pipeforge.verifier.events import Timing

    def blind(program, pairing, semantics):
        rows = tuple(tuple(range(len(row))) for row in program.slots)
        return Timing(rows, tuple(tuple(1 for _ in row) for row in program.slots))

    monkeypatch.setattr(verify_package, "run", blind)
    with pytest.raises(verify_package.VerifierDisagreement):
        verify(facing_sends(), solve=True)
    verify(facing_sends(), solve=False, certify=False)  # unchecked, the wrong verdict goes through


def test_a_plain_pass_that_disagrees_with_z3_on_order_is_an_internal_error(monkeypatch):
    import pipeforge.verifier as verify_package

    import pipeforge.verifier.structure as structure

    misses = lambda program: []  # noqa: E731  (a plain pass that misses the error)
    monkeypatch.setattr(structure, "check_order", misses)
    monkeypatch.setattr(verify_package, "check_order", misses)  # as the cross-check imports it
    with pytest.raises(verify_package.VerifierDisagreement):
        verify(schedule_of([["0B0", "0F0"], ["1F0", "1B0"]]), solve=True)
