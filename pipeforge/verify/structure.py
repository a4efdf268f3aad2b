"""Static checks, plain Python: placement, duplicate, missing and order (docs/semantics.md)."""

from __future__ import annotations

from collections import defaultdict

from pipeforge.ir import Action, ActionKind
from pipeforge.verify.program import Program, Slot, violation_at
from pipeforge.verify.report import Violation

F, B, I, W = ActionKind.F, ActionKind.B, ActionKind.I, ActionKind.W
SEND_F, RECV_F, SEND_B, RECV_B = ActionKind.SEND_F, ActionKind.RECV_F, ActionKind.SEND_B, ActionKind.RECV_B


def check_structure(program: Program) -> list[Violation]:
    chains = microbatch_chains(program)
    found = check_placement(program, chains)
    found += check_duplicates(program)
    found += check_missing(program, chains)
    if program.as_written:
        found += check_needed_comms(program)
    found += check_order(program)
    return found


# --- placement -----------------------------------------------------------------------------


def microbatch_chains(program: Program) -> dict[int, int]:
    """Each microbatch's chain: the chain of its first F on stage 0."""
    chains: dict[int, int] = {}
    for _, action in program.actions():
        if action.kind is F and action.stage == 0 and action.microbatch is not None:
            chains.setdefault(action.microbatch, action.chain)
    return chains


def check_placement(program: Program, chains: dict[int, int]) -> list[Violation]:
    found = []
    for slot, action in program.actions():
        reason = placement_problem(program, slot, action, chains)
        if reason:
            found.append(violation_at("placement", reason, slot))
    return found


def placement_problem(program: Program, slot: Slot, action: Action, chains: dict[int, int]) -> str | None:
    sched = program.schedule
    if not 0 <= action.chain < sched.chains:
        return f"{action}: chain {action.chain} is outside the declared chains 0..{sched.chains - 1}"
    if not 0 <= action.stage < sched.stages:
        return f"{action}: stage {action.stage} is outside 0..{sched.stages - 1}"
    if action.microbatch is not None and not 0 <= action.microbatch < sched.microbatches:
        return f"{action}: microbatch {action.microbatch} is outside 0..{sched.microbatches - 1}"
    if not (action.is_compute or action.is_comm):
        return None
    owner = program.rank_of(action.stage, action.chain)
    if owner != slot.rank:
        return f"{action} is on rank {slot.rank}, but stage {action.stage} (chain {action.chain}) is placed on rank {owner}"
    chain = chains.get(action.microbatch)
    if chain is not None and chain != action.chain:
        return f"{action}: microbatch {action.microbatch} belongs to chain {chain} (its F on stage 0)"
    if action.is_comm:
        return comm_placement_problem(program, slot, action)
    return None


def comm_placement_problem(program: Program, slot: Slot, action: Action) -> str | None:
    peer_stage = action.peer_stage()
    if not 0 <= peer_stage < program.schedule.stages:
        return f"{action}: its peer stage {peer_stage} does not exist"
    if program.peer_rank(action) == slot.rank:
        return f"{action} communicates between stages {action.stage} and {peer_stage}, both on rank {slot.rank}"
    return None


# --- duplicate and missing -----------------------------------------------------------------


def check_duplicates(program: Program) -> list[Violation]:
    found = []
    first: dict[Action, Slot] = {}
    backward: dict[tuple, set[ActionKind]] = defaultdict(set)
    for slot, action in program.actions():
        if not (action.is_compute or action.is_comm) or not program.in_range(action):
            continue
        if action in first:
            earlier = first[action]
            found.append(violation_at("duplicate", f"{action} again (first at rank {earlier.rank} step {earlier.index})", slot))
            continue
        first[action] = slot
        if action.kind in (B, I, W):
            key = (action.stage, action.microbatch, action.chain)
            clash = backward[key] & ({I, W} if action.kind is B else {B})
            backward[key].add(action.kind)
            if clash:
                other = "I or W" if action.kind is B else "B"
                found.append(violation_at("duplicate", f"{action}: stage {action.stage} microbatch "
                                          f"{action.microbatch} already has {other}", slot))
    return found


def present_compute(program: Program) -> set[Action]:
    return {a for _, a in program.actions() if a.is_compute and program.in_range(a)}


def check_missing(program: Program, chains: dict[int, int]) -> list[Violation]:
    sched = program.schedule
    present = present_compute(program)
    found = []
    for mb in range(sched.microbatches):
        chain = chains.get(mb, 0)
        for stage in range(sched.stages):
            for what in missing_of(present, stage, mb, chain):
                owner = program.rank_of(stage, chain)
                found.append(Violation("missing", f"stage {stage} microbatch {mb}: {what}", owner))
    return found


def missing_of(present: set[Action], stage: int, mb: int, chain: int) -> list[str]:
    def has(kind: ActionKind) -> bool:
        return Action(stage, kind, mb, chain) in present

    label = f"{stage}{{}}{mb}" + (f"@{chain}" if chain else "")
    what = []
    if not has(F):
        what.append(f"no forward {label.format('F')}")
    if has(B):
        return what
    if not has(I) and not has(W):
        what.append(f"no backward ({label.format('B')}, or {label.format('I')} and {label.format('W')})")
    elif not has(W):
        what.append(f"{label.format('I')} without {label.format('W')}")
    elif not has(I):
        what.append(f"{label.format('W')} without {label.format('I')}")
    return what


def needed_comms(program: Program) -> dict[Action, int | None]:
    """Every send and receive the cross-rank edges of the present compute actions need, with its rank."""
    sched = program.schedule
    needed: dict[Action, int | None] = {}
    for action in present_compute(program):
        s, m, c = action.stage, action.microbatch, action.chain
        here = program.rank_of(s, c)
        if action.kind is F and s + 1 < sched.stages and program.rank_of(s + 1, c) != here:
            needed[Action(s, SEND_F, m, c)] = here
            needed[Action(s + 1, RECV_F, m, c)] = program.rank_of(s + 1, c)
        if action.kind in (B, I) and s > 0 and program.rank_of(s - 1, c) != here:
            needed[Action(s, SEND_B, m, c)] = here
            needed[Action(s - 1, RECV_B, m, c)] = program.rank_of(s - 1, c)
    return needed


def check_needed_comms(program: Program) -> list[Violation]:
    needed = needed_comms(program)
    found = []
    present: set[Action] = set()
    for slot, action in program.actions():
        if not action.is_comm or not program.in_range(action):
            continue
        if action not in needed and action not in present:
            found.append(violation_at("duplicate", f"{action} is not needed: no cross-rank edge carries it", slot))
        present.add(action)
    for action, rank in sorted(needed.items()):
        if action not in present:
            found.append(Violation("missing", f"{action} is needed on rank {rank} and never posted", rank))
    return found


# --- order ---------------------------------------------------------------------------------


def check_order(program: Program) -> list[Violation]:
    found = []
    for row in program.slots:
        found += check_rank_order(program, row)
    return found


def check_rank_order(program: Program, row: tuple[Slot, ...]) -> list[Violation]:
    done: set[Action] = set()
    last_grad = last_gradient_slot(row)
    found = []
    for slot in row:
        for action in slot.step.actions:
            if not program.in_range(action):
                continue
            for need in unmet_needs(program, slot.rank, action, done):
                found.append(violation_at("order", f"{action} needs {need} earlier on rank {slot.rank}", slot))
            if action.kind is ActionKind.REDUCE_GRAD and last_grad.get(action.stage, -1) >= slot.number:
                found.append(violation_at("order", f"{action} comes before the last B/W of stage "
                                          f"{action.stage} on rank {slot.rank}", slot))
        done.update(slot.step.actions)
    return found


def last_gradient_slot(row: tuple[Slot, ...]) -> dict[int, int]:
    last: dict[int, int] = {}
    for slot in row:
        for action in slot.step.actions:
            if action.kind in (B, W):
                last[action.stage] = slot.number
    return last


def unmet_needs(program: Program, rank: int, action: Action, done: set[Action]) -> list[str]:
    """What ``action`` on ``rank`` needs strictly earlier and has not got (as text)."""
    alternatives = needs_of(program, rank, action)
    return [" or ".join(map(str, options)) for options in alternatives if not any(o in done for o in options)]


def needs_of(program: Program, rank: int, action: Action) -> list[tuple[Action, ...]]:
    """Each need is a tuple of alternatives, any one of which satisfies it."""
    s, m, c, kind = action.stage, action.microbatch, action.chain, action.kind
    last = program.schedule.stages - 1
    if kind is F:
        if s == 0:
            return []
        return [(Action(s - 1, F, m, c),) if program.rank_of(s - 1, c) == rank else (Action(s, RECV_F, m, c),)]
    if kind in (B, I):
        needs = [(Action(s, F, m, c),)]
        if s < last:
            same = program.rank_of(s + 1, c) == rank
            needs.append((Action(s + 1, B, m, c), Action(s + 1, I, m, c)) if same else (Action(s, RECV_B, m, c),))
        return needs
    if kind is W:
        return [(Action(s, I, m, c),)]
    if kind is SEND_F:
        return [(Action(s, F, m, c),)]
    if kind is SEND_B:
        return [(Action(s, B, m, c), Action(s, I, m, c))]
    return []
