"""verify: check a schedule against docs/semantics.md and return a Report.

Structural checks (placement, duplicate, missing, order, mismatch, memory) are
plain Python passes. Then the linear-time pass of ``events.py`` runs the ranks
as events: it either proposes a start time and duration for every step or finds
the wait cycle, whose constraints z3 proves unsatisfiable (the unsat core names
them). With ``solve`` z3 then decides the whole timing model with free start
times (the proposal only seeds it), and, on small schedules, the order and
completeness models of ``obligations.py``; any verdict of z3 that differs from
the Python one raises ``VerifierDisagreement`` (exit 70). Without it z3 checks
the proposed timing against the model (the certificate).
"""

from __future__ import annotations

from time import perf_counter

from pipeforge.errors import UsageError
from pipeforge.ir import MemorySpec, Schedule
from pipeforge.passes.lower import Lowered, lower_with_origins
from pipeforge.semantics import Semantics
from pipeforge.verifier.deadlock import deadlock_violation
from pipeforge.verifier.events import Stuck, group_slots, model_constraints, run
from pipeforge.verifier.matching import check_matching, pair_ops
from pipeforge.verifier.memory import check_memory
from pipeforge.verifier.model import check_certificate, decide, satisfiable, unsat_core
from pipeforge.verifier.obligations import completeness_text, order_texts
from pipeforge.verifier.program import Program
from pipeforge.verifier.report import KINDS, Hop, Report, Stats, Violation
from pipeforge.verifier.structure import (check_missing, check_needed_comms, check_order, check_structure,
                                          microbatch_chains)

SEMANTICS = tuple(Semantics)

__all__ = ["verify", "holds", "HALVES", "VerifierDisagreement", "Report", "Violation", "Hop", "Stats", "KINDS",
           "SEMANTICS"]


class VerifierDisagreement(RuntimeError):
    """The event pass and z3 reached different verdicts: a bug in pipeforge, never the input's fault."""


def verify(schedule: Schedule, *, semantics: Semantics | str = Semantics.RENDEZVOUS, memory_limit: float | None = None,
           certify: bool = True, solve: bool | None = None, lowered: Lowered | None = None) -> Report:
    """Check ``schedule``; a compute-only one is checked as ``lower`` makes it.

    ``solve``: z3 decides the timing model with free start times (``True``), or
    only checks the event pass's proposal (``False``); ``None`` solves when the
    model has at most ``SOLVE_BY_DEFAULT_UP_TO`` group steps (where the decision
    stays within the speed target; see benchmarks/verify/against_torch.py).
    ``lowered``: ``passes.lower.lower_with_origins(schedule)`` where the caller has it (codegen), so it is
    not lowered again.
    """
    if semantics not in SEMANTICS:
        raise UsageError(f"semantics {semantics!r}: expected one of {', '.join(SEMANTICS)}")
    return verify_schedule(schedule, Semantics(semantics), memory_limit, certify, solve, lowered)


SOLVE_BY_DEFAULT_UP_TO = 6000  # group steps (16 ranks x 64 microbatches x 2 stages has about 4,200)
# z3 decides order and completeness too (under solve) up to this many group steps; its simplex is slow
# on the long program-order chains of larger models (0.7 s at 16 x 64 x 2), and the plain passes decide
# them alone there (the report's "established" says which)
STRUCTURE_BY_Z3_UP_TO = 1200


def verify_schedule(schedule: Schedule, semantics: Semantics, memory_limit: float | None, certify: bool,
                    solve: bool | None, lowered: Lowered | None = None) -> Report:
    started = perf_counter()
    if lowered is None:
        lowered = lower_with_origins(schedule)
    program = Program.of(lowered.schedule, lowered.origins, schedule)
    pairing = pair_ops(program)
    violations = static_violations(program, pairing, schedule, memory_limit)
    outcome = run(program, pairing, semantics)
    groups = group_count(program)
    if solve is None:
        solve = certify and groups <= SOLVE_BY_DEFAULT_UP_TO
    solved = decide_timing(program, pairing, semantics, outcome) if solve else False
    structure_by_z3 = solve and groups <= STRUCTURE_BY_Z3_UP_TO
    if structure_by_z3:
        decide_structure(program)
    certified = False
    if isinstance(outcome, Stuck):
        core = deadlock_core(outcome) if certify or solve else None
        violations.append(deadlock_violation(program, outcome, schedule, core))
    elif certify and not solve:
        certified = check_timing(program, pairing, semantics, outcome)
    violations.sort(key=lambda v: KINDS.index(v.kind))
    stats = Stats(schedule.ranks, schedule.stages, schedule.microbatches, program.schedule.action_count(),
                  perf_counter() - started, program.step_count())
    established = establishment(solved, structure_by_z3, certified, any(v.kind == "deadlock" for v in violations))
    return Report(not violations, tuple(violations), stats, semantics, certified or solved, solved, established)


def establishment(solved: bool, structure_by_z3: bool, certified: bool, deadlocked: bool) -> dict[str, str]:
    """Per violation kind, what established the verdict on it."""
    found = {kind: "python" for kind in KINDS if kind != "syntax"}
    if structure_by_z3:
        found["order"] = found["missing"] = "z3: decided; python: located"
    if solved:
        found["deadlock"] = "z3: decided (free start times)" + ("; unsat core of the wait cycle" if deadlocked else "")
    elif deadlocked:
        found["deadlock"] = "event pass: wait cycle; z3: unsat core of it"
    elif certified:
        found["deadlock"] = "event pass: timing; z3: checked it (certificate)"
    else:
        found["deadlock"] = "event pass"
    return found


def decide_structure(program: Program) -> None:
    """z3 decides data dependencies and completeness too; they must agree with the plain passes."""
    missing = check_missing(program, microbatch_chains(program))
    if program.as_written:
        missing += check_needed_comms(program)
    found = {"order": bool(check_order(program)), "missing": any(v.kind == "missing" for v in missing)}
    for kind, texts in (("order", order_texts(program)), ("missing", [completeness_text(program)])):
        if all(map(satisfiable, texts)) == found[kind]:
            raise VerifierDisagreement(f"internal error: the plain pass found {'a' if found[kind] else 'no'} "
                                       f"{kind!r} violation, but z3 decides the {kind} model otherwise")


def group_count(program: Program) -> int:
    return sum(1 for row in program.slots for slot in row if slot.group)


def decide_timing(program: Program, pairing, semantics: Semantics, outcome) -> bool:
    """z3 decides the timing model with free start times; it must agree with the event pass."""
    seed = None if isinstance(outcome, Stuck) else outcome
    decision = decide(model_constraints(program, pairing, semantics), seed)
    if decision.satisfiable == (seed is None):
        found = "a wait cycle" if seed is None else "a timing"
        raise VerifierDisagreement(f"internal error: the event pass found {found}, but z3 decides the "
                                   f"{semantics} timing model is {'sat' if decision.satisfiable else 'unsat'}")
    return True


def static_violations(program: Program, pairing, schedule: Schedule, memory_limit: float | None,
                      parts: frozenset[str] | None = None) -> list[Violation]:
    """placement, duplicate, missing, order, mismatch and memory: plain Python passes (or those of them in
    ``parts``, one of the ``HALVES``; ``pairing`` may be None where it has no ``mismatch``)."""
    violations = check_structure(program) if parts is None else check_structure(program, parts)
    if parts is None or "mismatch" in parts:
        violations += check_matching(pairing)
    if parts is None or "memory" in parts:
        memory = schedule.memory or MemorySpec()
        violations += check_memory(program, memory_limit if memory_limit is not None else memory.limit, memory)
    return violations


# verify's checks in two halves of about equal work (ZBV at P=64, M=1024: 1.9 and 3.6 s with Program.of in
# each), each decided alone: a schedule is valid (``verify(...).valid``, whatever ``certify`` and ``solve``)
# exactly when both hold. codegen decides one in a forked child while it renders, and the other after.
HALVES = {"structure": frozenset({"placement", "duplicate", "missing", "sharding", "memory"}),
          "timing": frozenset({"order", "mismatch", "deadlock"})}


def holds(schedule: Schedule, half: str, *, semantics: Semantics | str = Semantics.RENDEZVOUS,
          memory_limit: float | None = None, lowered: Lowered | None = None) -> bool:
    """Whether ``schedule`` passes the checks of one of the ``HALVES`` of ``verify`` (``verify_schedule``'s
    own passes, without a report: where one fails, ``verify`` says what)."""
    parts = HALVES[half]
    if lowered is None:
        lowered = lower_with_origins(schedule)
    program = Program.of(lowered.schedule, lowered.origins, schedule)
    pairing = pair_ops(program) if "mismatch" in parts else None
    if static_violations(program, pairing, schedule, memory_limit, parts):
        return False
    # (the half that pairs the ops, for mismatch, is the one with deadlock)
    return pairing is None or not isinstance(run(program, pairing, Semantics(semantics)), Stuck)


def check_timing(program: Program, pairing, semantics: Semantics, timing) -> bool:
    certificate = check_certificate(group_slots(program), model_constraints(program, pairing, semantics), timing)
    if not certificate.checked:
        raise RuntimeError("internal error: z3 rejected the timing the event pass proposed")
    return True


def deadlock_core(stuck: Stuck):
    core = unsat_core(stuck.cycle_constraints())
    if core is None:
        raise RuntimeError("internal error: z3 finds the wait cycle the event pass reported satisfiable")
    return core
