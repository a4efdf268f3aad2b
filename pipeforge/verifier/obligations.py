"""Data dependencies and completeness as SMT-LIB text, for z3 to decide (``verify --solve``).

The plain passes of ``structure.py`` find each ``order`` and ``missing`` violation
and say where it is; under ``--solve`` z3 also decides the same properties from
these models, and a different verdict is an internal error:

- ``order_texts``: one model per rank (order is a property of each rank's
  program, and z3's simplex is much quicker on 32 small models than on one of
  32 times the size: 1.3 s against a few hundredths at 16 ranks x 64
  microbatches x 2 stages). Every slot that produces or needs something on the
  rank gets a free position ``p``; program order ``p[j] - p[k] >= j - k`` between
  consecutive such slots; each need (one of its alternatives strictly earlier on
  the rank: ``semantics.local_needs``, with the same exemptions as
  ``check_rank_order``) ``p[consumer] - p[producer] >= 1`` for the first
  occurrence of an alternative. All satisfiable iff ``check_order`` finds no
  ``order`` (the data dependencies; the stage-only actions' order is sharding.py's).
- ``completeness_text``: a Boolean per (kind, stage, microbatch) of the kinds
  completeness speaks of, each fixed by what the schedule holds, and for every
  (stage, microbatch) one of ``semantics.COMPLETE``'s alternatives (``F and
  (B or (I and W))``) and each of ``semantics.REQUIRES`` (``W => I``); for written communication also every
  needed send and receive on its rank. Satisfiable iff ``check_missing`` and
  ``check_needed_comms`` find nothing ``missing``.
"""

from __future__ import annotations

from pipeforge.ir import COMPUTE_KINDS
from pipeforge.semantics import COMPLETE, REQUIRES, ActionKey, local_needs
from pipeforge.verifier.program import Program
from pipeforge.verifier.structure import needed_comms, present_compute


def order_texts(program: Program) -> list[str]:
    texts = []
    bad = program.out_of_range
    for row in program.slots:
        declared: list[str] = []
        asserted: list[str] = []
        first: dict[ActionKey, int] = {}
        for slot in row:
            for key in slot.acts:
                first.setdefault(key, slot.number)
        edges: list[tuple[int, tuple[int, ...]]] = []  # (consumer, producers: one must come first)
        for slot in row:
            for key in slot.acts:
                if key in bad or program.owners[key[3]][key[0]] != slot.rank:
                    continue
                for need in local_needs(key, program.schedule.stages, program.owners[key[3]], slot.rank):
                    producers = tuple(first[option] for option in need if option in first)
                    if producers:
                        edges.append((slot.number, producers))
        if not edges:
            continue
        rank = row[0].rank
        used = sorted({k for consumer, producers in edges for k in (consumer, *producers)})
        declared.extend(f"(declare-const p{rank}_{k} Real)" for k in used)
        for consumer, producers in edges:
            for k in producers:  # program order between the two, as one summed constraint
                first, then = min(k, consumer), max(k, consumer)
                asserted.append(f"(>= (- p{rank}_{then} p{rank}_{first}) {then - first})")
            options = [f"(>= (- p{rank}_{consumer} p{rank}_{k}) 1)" for k in producers]
            asserted.append(options[0] if len(options) == 1 else f"(or {' '.join(options)})")
        texts.append("\n".join(declared + [f"(assert (and true {' '.join(asserted)}))"]))
    return texts


def completeness_text(program: Program) -> str:
    sched = program.schedule
    present = {(stage, kind, mb) for stage, kind, mb, _ in present_compute(program)}
    lines, facts, goals = [], [], []
    kinds = sorted({kind for alternative in COMPLETE for kind in alternative} | set(REQUIRES)
                   | {kind for required in REQUIRES.values() for kind in required})
    for stage in range(sched.stages):
        for mb in range(sched.microbatches):
            names = {}
            for kind in kinds:
                name = names[kind] = f"h{kind.value}_{stage}_{mb}"
                lines.append(f"(declare-const {name} Bool)")
                facts.append(name if (stage, kind, mb) in present else f"(not {name})")
            complete = " ".join(f"(and {' '.join(names[k] for k in alternative)})" for alternative in COMPLETE)
            required = " ".join(f"(=> {names[kind]} {names[other]})"
                                for kind, others in REQUIRES.items() for other in others)
            goals.append(f"(and (or {complete}) {required})")
    if program.as_written:
        placed = {(key, slot.rank) for slot, key in program.actions() if key[1] not in COMPUTE_KINDS}
        for n, (key, rank) in enumerate(needed_comms(program).items()):
            name = f"c{n}"
            lines.append(f"(declare-const {name} Bool)")
            facts.append(name if (key, rank) in placed else f"(not {name})")
            goals.append(name)
    lines.append(f"(assert (and true {' '.join(facts)}))")
    lines.append(f"(assert (and true {' '.join(goals)}))")
    return "\n".join(lines)
