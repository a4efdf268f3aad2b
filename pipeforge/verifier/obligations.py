"""Data dependencies and completeness as SMT-LIB text, for z3 to decide (``verify --solve``).

``order_texts(program)``: one model per rank, satisfiable iff ``structure.check_order`` finds no
``order`` violation; ``completeness_text(program)``: one model, satisfiable iff ``check_missing`` and
``check_needed_comms`` find nothing ``missing``. The plain passes locate each violation; z3 decides the
same properties from these, and a different verdict is an internal error. The models:
``docs/verifier.md``.
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
                earlier, then = min(k, consumer), max(k, consumer)
                asserted.append(f"(>= (- p{rank}_{then} p{rank}_{earlier}) {then - earlier})")
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
