"""A deadlock as the user sees it: the wait cycle hop by hop, the z3 core, the stuck grid."""

from __future__ import annotations

from pipeforge.ir import Schedule, format_grid
from pipeforge.verifier.program import Program
from pipeforge.verifier.report import Hop, Violation, describe_cycle
from pipeforge.verifier.events import Constraint, Stuck


def deadlock_violation(program: Program, stuck: Stuck, written: Schedule,
                       core: list[Constraint] | None) -> Violation:
    hops = tuple(hop_of(program, wait) for wait in stuck.chain)
    message = describe_cycle(hops)
    if stuck.cycle_from is not None:
        message += f" (rank {hops[stuck.cycle_from].rank} again: a cycle)"
    first = stuck.chain[0].slot
    return Violation(
        "deadlock", message, first.rank, first.index,
        str(first.span) if first.span else None, first.span,
        cycle=hops,
        core=tuple(describe_constraint(program, c) for c in core or ()),
        grid=stuck_grid(written, stuck_marks(program, stuck)),
    )


def stuck_grid(written: Schedule, marks: dict[tuple[int, int], str], context: int = 3) -> str:
    """The rank x step grid with the stuck steps marked, cut to the rows around them."""
    lines = format_grid(written, marks).rstrip("\n").split("\n")
    steps = [step for _, step in marks] or [0]
    first, last = max(min(steps) - context, 0), min(max(steps) + context, len(lines) - 2)
    rows = lines[1 + first:2 + last]
    if first > 0:
        rows.insert(0, f"... ({first} steps above)")
    if last < len(lines) - 2:
        rows.append(f"... ({len(lines) - 2 - last} steps below)")
    return "\n".join([lines[0]] + rows) + "\n"


def hop_of(program: Program, wait) -> Hop:
    slot = wait.slot
    peer_step = program.slots[wait.target[0]][wait.target[1]].index if wait.target else None
    return Hop(slot.rank, slot.index, slot.text, wait.waits_for, wait.peer, slot.span, wait.peer_finished, peer_step,
               wait.posted, group_text(program, wait.target) if wait.posted else None)


def group_text(program: Program, key: tuple[int, int]) -> str:
    return str(program.slots[key[0]][key[1]].step)


def stuck_marks(program: Program, stuck: Stuck) -> dict[tuple[int, int], str]:
    marks = {}
    for rank, row in enumerate(program.slots):
        k = stuck.position[rank]
        if k < len(row):
            marks[(rank, row[k].index)] = "*"
    return marks


def place(program: Program, key: tuple[int, int]) -> str:
    slot = program.slots[key[0]][key[1]]
    shown = str(slot.step)
    origin = f" serving {slot.text}" if shown != slot.text else ""
    where = f" ({slot.span})" if slot.span else ""
    return f"rank {slot.rank} step {slot.index} {shown}{origin}{where}"


def describe_constraint(program: Program, constraint: Constraint) -> str:
    kind = constraint[0]
    if kind == "order":
        _, r, k = constraint
        return f"program order: {place(program, (r, k))} before {place(program, (r, k + 1))}"
    if kind == "after":
        _, r, k, j = constraint
        return f"program order: {place(program, (r, j))} starts after {place(program, (r, k))} ends"
    if kind == "duration":
        return f"duration >= 1 of {place(program, (constraint[1], constraint[2]))}"
    if kind == "rendezvous":
        return f"rendezvous: {place(program, constraint[1])} meets {place(program, constraint[2])}"
    if kind == "buffered":
        return f"posted: {place(program, constraint[1])} ends after {place(program, constraint[2])} is posted"
    return f"unmatched: {constraint[2]} at {place(program, constraint[1])} has no partner"
