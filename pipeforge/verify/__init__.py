"""verify: check a schedule against docs/semantics.md and return a Report.

Structural checks (placement, duplicate, missing, order, mismatch, memory) are
plain Python passes. Then the linear-time pass of ``timing.py`` runs the ranks
as events: it either proposes a start time and duration for every step, which
z3 checks against the whole timing model (``model.py``; the satisfying model is
the certificate), or finds the wait cycle, whose constraints z3 proves
unsatisfiable (the unsat core names them).
"""

from __future__ import annotations

from time import perf_counter

from pipeforge._gc import gc_paused
from pipeforge.errors import UsageError
from pipeforge.ir import MemorySpec, Schedule
from pipeforge.passes.lower import lower_with_origins
from pipeforge.verify.deadlock import deadlock_violation
from pipeforge.verify.matching import check_matching, check_memory, pair_ops
from pipeforge.verify.program import Program
from pipeforge.verify.report import KINDS, Hop, Report, Stats, Violation
from pipeforge.verify.structure import check_structure
from pipeforge.verify.timing import Stuck, group_slots, model_constraints, run

SEMANTICS = ("rendezvous", "buffered")

__all__ = ["verify", "Report", "Violation", "Hop", "Stats", "KINDS", "SEMANTICS"]


def verify(schedule: Schedule, *, semantics: str = "rendezvous", memory_limit: float | None = None,
           certify: bool = True) -> Report:
    """Check ``schedule``; a compute-only one is checked as ``lower`` makes it."""
    if semantics not in SEMANTICS:
        raise UsageError(f"semantics {semantics!r}: expected one of {', '.join(SEMANTICS)}")
    with gc_paused():
        return verify_schedule(schedule, semantics, memory_limit, certify)



def verify_schedule(schedule: Schedule, semantics: str, memory_limit: float | None, certify: bool) -> Report:
    started = perf_counter()
    lowered = lower_with_origins(schedule)
    program = Program.of(lowered.schedule, lowered.origins, schedule)
    pairing = pair_ops(program)
    violations = static_violations(program, pairing, schedule, memory_limit)
    outcome = run(program, pairing, semantics)
    certified = False
    if isinstance(outcome, Stuck):
        core = deadlock_core(outcome) if certify else None
        violations.append(deadlock_violation(program, outcome, schedule, core))
    elif certify:
        certified = check_timing(program, pairing, semantics, outcome)
    violations.sort(key=lambda v: KINDS.index(v.kind))
    stats = Stats(schedule.ranks, schedule.stages, schedule.microbatches, program.schedule.action_count(),
                  perf_counter() - started, program.step_count())
    return Report(not violations, tuple(violations), stats, semantics, certified)


def static_violations(program: Program, pairing, schedule: Schedule, memory_limit: float | None) -> list[Violation]:
    """placement, duplicate, missing, order, mismatch and memory: plain Python passes."""
    violations = check_structure(program)
    violations += check_matching(pairing)
    memory = schedule.memory or MemorySpec()
    limit = memory_limit if memory_limit is not None else memory.limit
    violations += check_memory(program, limit, memory.weights, memory.unsharded)
    return violations


def check_timing(program: Program, pairing, semantics: str, timing) -> bool:
    from pipeforge.verify.model import check_certificate

    certificate = check_certificate(group_slots(program), model_constraints(program, pairing, semantics), timing)
    if not certificate.checked:
        raise RuntimeError("internal error: z3 rejected the timing the event pass proposed")
    return True


def deadlock_core(stuck: Stuck):
    from pipeforge.verify.model import unsat_core

    core = unsat_core(stuck.cycle_constraints())
    if core is None:
        raise RuntimeError("internal error: z3 finds the wait cycle the event pass reported satisfiable")
    return core


from pipeforge._callable import make_callable  # noqa: E402

make_callable(__name__)  # pipeforge.verify(...) calls verify()
