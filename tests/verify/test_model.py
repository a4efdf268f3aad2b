"""The z3 model: it accepts the event pass's timing, rejects a wrong one, and cores a wait cycle."""

from __future__ import annotations

from dataclasses import replace

from pipeforge.ir import Placement, Schedule, programs_from_tokens
from pipeforge.passes.lower import lower_with_origins
from pipeforge.verifier.matching import pair_ops
from pipeforge.verifier.model import check_certificate, smt_of, unsat_core
from pipeforge.verifier.program import Program
from pipeforge.verifier.events import Stuck, Timing, group_slots, model_constraints, run


def program_of(rows, stages=2, microbatches=1) -> Program:
    schedule = Schedule("m", 2, stages, microbatches, (Placement.loop(stages, 2),), programs_from_tokens(rows))
    lowered = lower_with_origins(schedule)
    return Program.of(lowered.schedule, lowered.origins, schedule)


OK = [["0F0", "0SEND_F0", "0RECV_B0", "0B0"], ["1RECV_F0", "1F0", "1B0", "1SEND_B0"]]


def test_the_proposed_timing_is_a_certificate_under_both_semantics():
    program = program_of(OK)
    pairing = pair_ops(program)
    for semantics in ("rendezvous", "buffered"):
        timing = run(program, pairing, semantics)
        assert isinstance(timing, Timing)
        certificate = check_certificate(group_slots(program), model_constraints(program, pairing, semantics), timing)
        assert certificate.checked


def test_z3_rejects_a_timing_that_breaks_the_rendezvous():
    program = program_of(OK)
    pairing = pair_ops(program)
    timing = run(program, pairing, "rendezvous")
    starts = [list(row) for row in timing.start]
    starts[1][0] += 1  # 1RECV_F0 no longer meets 0SEND_F0 at the same time
    broken = replace(timing, start=tuple(map(tuple, starts)))
    constraints = model_constraints(program, pairing, "rendezvous")
    assert not check_certificate(group_slots(program), constraints, broken).checked


def test_z3_rejects_a_timing_that_breaks_program_order():
    program = program_of(OK)
    pairing = pair_ops(program)
    timing = run(program, pairing, "buffered")
    starts = [list(row) for row in timing.start]
    starts[0][2] = starts[0][1]  # 0RECV_B0 starting with 0SEND_F0, which takes at least 1
    broken = replace(timing, start=tuple(map(tuple, starts)))
    assert not check_certificate(group_slots(program), model_constraints(program, pairing, "buffered"), broken).checked


def test_the_core_of_a_two_rank_cycle_is_small_and_along_the_cycle():
    rows = [["0RECV_B0", "0F0", "0SEND_F0", "0B0"], ["1RECV_F0", "1F0", "1B0", "1SEND_B0"]]
    program = program_of(rows)
    stuck = run(program, pair_ops(program), "rendezvous")
    assert isinstance(stuck, Stuck) and stuck.cycle_from == 0
    core = unsat_core(stuck.cycle_constraints())
    assert core is not None and 2 <= len(core) <= 10
    assert {c[0] for c in core} == {"rendezvous", "after", "duration"}


def test_constraints_read_as_smt_lib():
    assert smt_of(("order", 1, 2)) == "(>= t1_3 (+ t1_2 d1_2))"
    assert smt_of(("rendezvous", (0, 1), (1, 0))) == "(= t0_1 t1_0)"
    assert smt_of(("buffered", (0, 1), (1, 0))) == "(>= (+ t0_1 d0_1) (+ t1_0 1))"
    assert smt_of(("gap", 0, 1, 4)) == "(>= t0_4 (+ t0_1 3))"
    assert smt_of(("after", 0, 1, 4)) == "(>= t0_4 (+ t0_1 d0_1 2))"


def test_a_satisfiable_set_has_no_core():
    assert unsat_core([("order", 0, 0), ("duration", 0, 0)]) is None


def test_z3_decides_whatever_the_seed_its_variables_are_measured_from():
    """The seed only moves the origin of each variable (an exact change of variables): a wrong or
    absurd one changes no verdict, on a schedule that is valid and on one that deadlocks."""
    from pipeforge.verifier.model import decide

    stuck_rows = [["0RECV_B0", "0F0", "0SEND_F0", "0B0"], ["1RECV_F0", "1F0", "1B0", "1SEND_B0"]]
    for program, valid in ((program_of(OK), True), (program_of(stuck_rows), False)):
        pairing = pair_ops(program)
        for semantics in ("rendezvous", "buffered", "nccl"):
            proposed = run(program, pairing, semantics)
            assert isinstance(proposed, Timing) == valid
            rows = [len(row) for row in program.slots]
            seeds = [None, Timing(tuple((0,) * n for n in rows), tuple((1,) * n for n in rows)),
                     Timing(tuple(tuple(range(n, 0, -1)) for n in rows), tuple((1,) * n for n in rows))]
            if valid:
                seeds.append(proposed)
            constraints = model_constraints(program, pairing, semantics)
            for seed in seeds:
                assert decide(constraints, seed).satisfiable == valid, (semantics, seed)


def test_a_model_z3_refuses_is_an_internal_error_not_a_verdict():
    import pytest

    from pipeforge.verifier.model import satisfiable

    with pytest.raises(RuntimeError, match="z3 refused"):
        satisfiable("(assert (> undeclared 1))")
