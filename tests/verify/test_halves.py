"""verify's verdict in two halves (``verifier.holds``, what codegen decides in two processes): a schedule is
valid exactly when both halves hold, on valid and broken schedules, compute-only, lowered and with written
communication, with and without a memory limit, under both semantics."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import pipeforge.testing as pt
from pipeforge import load
from pipeforge.ir import Placement, Schedule, programs_from_tokens
from pipeforge.verifier import HALVES, holds, verify
from pipeforge.verifier.structure import STRUCTURE_PARTS

FAST = settings(max_examples=80, deadline=None, suppress_health_check=list(HealthCheck), database=None)
SMALL = dict(max_ranks=3, max_stages_per_rank=2, max_microbatches=4)
SEMANTICS = st.sampled_from(["rendezvous", "buffered"])


def agree(schedule: Schedule, semantics: str, memory_limit: float | None = None) -> None:
    report = verify(schedule, semantics=semantics, memory_limit=memory_limit, certify=False)
    found = {half: holds(schedule, half, semantics=semantics, memory_limit=memory_limit) for half in HALVES}
    assert all(found.values()) == report.valid, (found, report.violations)
    kinds = {violation.kind for violation in report.violations}
    for half, only_here in (("structure", {"placement", "memory"}), ("timing", {"mismatch", "deadlock"})):
        assert found[half] or kinds, half  # a half that fails has a report to show
        assert not found[half] or not kinds & only_here, (half, report.violations)  # kinds no other check makes


def test_the_halves_hold_every_check_once():
    assert set().union(*HALVES.values()) == STRUCTURE_PARTS | {"memory", "mismatch", "deadlock"}
    assert not HALVES["structure"] & HALVES["timing"]


@FAST
@given(pt.mutated_schedules(**SMALL), SEMANTICS)
def test_a_broken_compute_only_schedule(schedule, semantics):
    agree(schedule, semantics)


@FAST
@given(pt.mutated_schedules(comms="random", **SMALL), SEMANTICS)
def test_a_broken_schedule_with_written_communication(schedule, semantics):
    agree(schedule, semantics)


@FAST
@given(st.one_of(pt.schedules(**SMALL), pt.schedules(lowered=True, **SMALL), pt.schedules(memory=True, **SMALL)),
       SEMANTICS, st.sampled_from([None, 1.0, 2.0]))
def test_a_schedule_with_or_without_a_memory_limit(schedule, semantics, limit):
    agree(schedule, semantics, limit)


def test_each_half_fails_alone():
    order = Schedule("order", 2, 2, 1, (Placement.loop(2, 2),), programs_from_tokens([["0F0", "0B0"], ["1B0", "1F0"]]))
    missing = Schedule("missing", 2, 2, 1, (Placement.loop(2, 2),), programs_from_tokens([["0F0", "0B0"], ["1F0"]]))
    assert holds(order, "structure") and not holds(order, "timing")
    assert not holds(missing, "structure")
    assert all(holds(load("zbv", defines={"P": 3, "M": 6}), half) for half in HALVES)
