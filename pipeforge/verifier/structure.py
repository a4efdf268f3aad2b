"""Static checks, plain Python: placement, duplicate, missing and order (docs/semantics.md).

What each action needs, what carries a cross-rank edge and what makes a (stage,
microbatch) complete come from ``pipeforge.semantics``; every kind is handled by
its role there (compute, communication or stage-only), none is skipped unseen.
Actions are ``Action`` NamedTuples: they hash and compare in C, which keeps
these passes linear and quick.
"""

from __future__ import annotations

from itertools import chain as _chain
from itertools import compress as _compress
from itertools import filterfalse as _filterfalse
from itertools import product as _product
from operator import attrgetter, itemgetter

from pipeforge.ir import ActionKind
from pipeforge.semantics import (COMPLETE, EXCLUDES, NEEDLESS_KINDS, PEER_OFFSET, REQUIRES, ROLES, ActionKey,
                                 local_needs, output, role)
from pipeforge.verifier.program import Program, Slot, text_of, violation_at
from pipeforge.verifier.report import Violation
from pipeforge.verifier.sharding import check_sharding, stage_only_placement_problem

F, B, I, W = ActionKind.F, ActionKind.B, ActionKind.I, ActionKind.W  # noqa: E741


STRUCTURE_PARTS = frozenset({"placement", "duplicate", "missing", "order", "sharding"})


def check_structure(program: Program, parts: frozenset[str] = STRUCTURE_PARTS) -> list[Violation]:
    """The structural checks, or those of them in ``parts`` (``verifier.HALVES``: a verdict in halves):
    ``missing`` holds the written communication's check against what the edges need."""
    chains = microbatch_chains(program)
    found = check_placement(program, chains) if "placement" in parts else []
    if "duplicate" in parts:
        found += check_duplicates(program)
    if "missing" in parts:
        found += check_missing(program, chains)
        if program.as_written:
            found += check_needed_comms(program)
    if "order" in parts:
        found += check_order(program)
    if "sharding" in parts:
        found += check_sharding(program)
    return found


# --- placement -----------------------------------------------------------------------------


def microbatch_chains(program: Program) -> dict[int, int]:
    """Each microbatch's chain: the chain of its first F on stage 0."""
    chains: dict[int, int] = {}
    if program.schedule.chains > 1:
        for _, (stage, kind, mb, chain) in program.actions():
            if kind is F and stage == 0 and mb is not None:
                chains.setdefault(mb, chain)
    return chains


def check_placement(program: Program, chains: dict[int, int]) -> list[Violation]:
    found = []
    bad = program.out_of_range
    placed_on = {} if chains else well_placed_ranks(program)  # several chains: each action looked at in full
    for row in program.slots:
        for slot in row:
            rank = slot.rank
            for key in slot.acts:
                if placed_on.get((key[0], key[1], key[3])) == rank and (not bad or key not in bad):
                    continue  # the common case
                reason = placement_problem(program, slot, key, chains)
                if reason:
                    found.append(violation_at("placement", reason, slot))
    return found


def well_placed_ranks(program: Program) -> dict[tuple[int, ActionKind, int], int]:
    """(stage, kind, chain) -> the rank on which an in-range action of them is ``well_placed``: a table
    looked up once per action (a call per action cost a third of the check)."""
    table = {}
    for chain, owners in enumerate(program.owners):
        for kind in ROLES:
            for stage, rank in enumerate(owners):
                if well_placed(owners, rank, (stage, kind, None, chain)):
                    table[(stage, kind, chain)] = rank
    return table


def well_placed(owners: tuple[int, ...], rank: int, key: ActionKey) -> bool:
    """An in-range compute or communication action on its stage's rank (and a peer elsewhere)."""
    stage, kind = key[0], key[1]
    if owners[stage] != rank:
        return False
    kind_role = ROLES[kind]
    if kind_role == "compute":
        return True
    if kind_role != "comm":
        return False
    peer_stage = stage + PEER_OFFSET[kind]
    return 0 <= peer_stage < len(owners) and owners[peer_stage] != rank


def placement_problem(program: Program, slot: Slot, key: ActionKey, chains: dict[int, int]) -> str | None:
    sched = program.schedule
    stage, kind, mb, chain = key
    kind_role = role(kind)
    if key not in program.out_of_range and kind_role == "compute":
        return compute_placement_problem(program, slot, key, chains)
    if not 0 <= chain < sched.chains:
        return f"{text_of(key)}: chain {chain} is outside the declared chains 0..{sched.chains - 1}"
    if not 0 <= stage < sched.stages:
        return f"{text_of(key)}: stage {stage} is outside 0..{sched.stages - 1}"
    if mb is not None and not 0 <= mb < sched.microbatches:
        return f"{text_of(key)}: microbatch {mb} is outside 0..{sched.microbatches - 1}"
    if kind_role == "stage":
        return stage_only_placement_problem(program, slot, key)
    problem = compute_placement_problem(program, slot, key, chains)
    if problem is None and kind_role == "comm":
        return comm_placement_problem(program, slot, key)
    return problem


def compute_placement_problem(program: Program, slot: Slot, key: ActionKey, chains: dict[int, int]) -> str | None:
    """The common case, kept short: an in-range compute action (and what an in-range communication
    action must meet before its peer's checks): on its stage's rank, of its microbatch's chain."""
    stage, _, mb, chain = key
    owner = program.owners[chain][stage]
    if owner != slot.rank:
        return f"{text_of(key)} is on rank {slot.rank}, but stage {stage} (chain {chain}) is placed on rank {owner}"
    if chains and chains.get(mb, chain) != chain:
        return f"{text_of(key)}: microbatch {mb} belongs to chain {chains[mb]} (its F on stage 0)"
    return None


def comm_placement_problem(program: Program, slot: Slot, key: ActionKey) -> str | None:
    peer = key[0] + PEER_OFFSET[key[1]]
    if not 0 <= peer < program.schedule.stages:
        return f"{text_of(key)}: its peer stage {peer} does not exist"
    if program.rank_of(peer, key[3]) == slot.rank:
        return f"{text_of(key)} communicates between stages {key[0]} and {peer}, both on rank {slot.rank}"
    return None


# --- duplicate and missing -----------------------------------------------------------------


def check_duplicates(program: Program) -> list[Violation]:
    if surely_unique(program):
        return []
    found = []
    first: dict[ActionKey, Slot] = {}
    backward: dict[tuple, set[ActionKind]] = {}
    bad = program.out_of_range
    for row in program.slots:
        for slot in row:
            for key in slot.acts:
                kind = key[1]
                if ROLES[kind] == "stage" or (bad and key in bad):
                    continue  # a stage-only action may be written again (each REDUCE_GRAD is a no-op after the first)
                if key in first:
                    earlier = first[key]
                    found.append(violation_at("duplicate", f"{text_of(key)} again (first at rank {earlier.rank} "
                                              f"step {earlier.index})", slot))
                    continue
                first[key] = slot
                if kind in EXCLUDES:
                    kinds = backward.setdefault((key[0], key[2], key[3]), set())
                    if kinds and kinds & EXCLUDES[kind]:
                        other = " or ".join(sorted(EXCLUDES[kind]))
                        found.append(violation_at("duplicate", f"{text_of(key)}: stage {key[0]} microbatch "
                                                  f"{key[2]} already has {other}", slot))
                    kinds.add(kind)
    return found


def surely_unique(program: Program) -> bool:
    """The common case, decided by sizes of sets (built in C, a third of the walk's time): every
    action in range, none written twice (not even a stage-only one, which may be), and no kind
    beside one it ``EXCLUDES`` (B beside I or W) anywhere. When this says no, ``check_duplicates``
    walks the actions to find why."""
    if program.out_of_range:
        return False
    keys = list(_flatten(map(_acts_of, _flatten(program.slots))))
    if len(set(keys)) != len(keys):
        return False
    kinds = set(map(_kind_of, keys))
    return not any(kind in kinds and not kinds.isdisjoint(others) for kind, others in EXCLUDES.items())


_flatten, _acts_of, _kind_of, _group_of = _chain.from_iterable, attrgetter("acts"), itemgetter(1), attrgetter("group")


def present_compute(program: Program) -> frozenset[ActionKey]:
    """The in-range compute actions of the program (``program.compute``, less those out of range)."""
    present = program.compute
    return present - program.out_of_range if program.out_of_range else present


def check_missing(program: Program, chains: dict[int, int]) -> list[Violation]:
    """Completeness per (stage, microbatch), whatever the chains (an action on the wrong chain is
    a placement error, not a missing one)."""
    sched = program.schedule
    present: set[ActionKey] | frozenset[ActionKey] = present_compute(program)
    if sched.chains > 1:  # (with one chain every action in range is of chain 0 already)
        present = {(stage, kind, mb, 0) for stage, kind, mb, _ in present}
    if complete_in_one_form(present, sched.stages, sched.microbatches):
        return []
    found: list[Violation] = []
    more = 0
    for mb in range(sched.microbatches):
        chain = chains.get(mb, 0)
        for stage in range(sched.stages):
            for what in missing_of(present, stage, mb):
                if len(found) >= MAX_MISSING_REPORTED:
                    more += 1
                    continue
                owner = program.rank_of(stage, chain)
                found.append(Violation("missing", f"stage {stage} microbatch {mb}: {what}", owner))
    if more:
        found.append(Violation("missing", f"... and {more} more missing actions not listed"))
    return found


def complete_in_one_form(present: set[ActionKey] | frozenset[ActionKey], stages: int, microbatches: int) -> bool:
    """The common case, decided by sets (built in C): the present compute actions (of chain 0) are
    exactly one of the ``semantics.COMPLETE`` forms for every (stage, microbatch), F and B or F, I and
    W, and nothing else, so ``missing_of`` finds nothing anywhere; when this says no, ``check_missing``
    asks it for each (stage, microbatch)."""
    for kinds in COMPLETE:
        if len(present) == len(kinds) * stages * microbatches and \
                present.issuperset(_product(range(stages), kinds, range(microbatches), (0,))):
            return True
    return False


MAX_MISSING_REPORTED = 1000  # a mistyped --stages 1000000 must not list millions of lines


_REQUIRING = tuple(kind for kind in REQUIRES if kind is not W)  # beyond W (checked below): OFFLOAD, RELOAD


def missing_of(present: set[ActionKey] | frozenset[ActionKey], stage: int, mb: int) -> list[str]:
    """What the (stage, microbatch) lacks: an F, and a B or both I and W (``semantics.SPLIT``)."""
    has_f, has_b, has_w = (stage, F, mb, 0) in present, (stage, B, mb, 0) in present, (stage, W, mb, 0) in present
    if has_f and has_b and not has_w and not any((stage, kind, mb, 0) in present for kind in _REQUIRING):
        return []
    has_i = (stage, I, mb, 0) in present

    def name(kind: ActionKind) -> str:
        return text_of((stage, kind, mb, 0))

    what = [] if has_f else [f"no forward {name(F)}"]
    if not has_b and not has_i and not has_w:
        what.append(f"no backward ({name(B)}, or {name(I)} and {name(W)})")
    elif not has_b and has_i and not has_w:
        what.append(f"{name(I)} without {name(W)}")
    for kind, others in REQUIRES.items():  # W without I, even beside a B (which is then also a duplicate)
        if (stage, kind, mb, 0) in present:
            what.extend(f"{name(kind)} without {name(other)}" for other in others
                        if (stage, other, mb, 0) not in present)
    return what


def needed_comms(program: Program) -> dict[ActionKey, int | None]:
    """Every send and receive the cross-rank edges of the present compute actions need, with its rank.
    ``semantics.output`` is asked once per (stage, kind, chain): where its output goes does not depend on
    the microbatch."""
    stages = program.schedule.stages
    needed: dict[ActionKey, int | None] = {}
    edges: dict[tuple, Edge] = {}
    for action in present_compute(program):
        stage, kind, mb, chain = action
        edge = edges.get((stage, kind, chain))
        if edge is None:
            edge = edges[(stage, kind, chain)] = cross_rank_edge(program, action, stages)
        if edge:
            send_stage, send_kind, send_rank, recv_stage, recv_kind, recv_rank = edge
            needed[(send_stage, send_kind, mb, chain)] = send_rank
            needed[(recv_stage, recv_kind, mb, chain)] = recv_rank
    return needed


Edge = tuple  # (send stage, kind, rank, receive stage, kind, rank), or () for none


def cross_rank_edge(program: Program, action: ActionKey, stages: int) -> Edge:
    """(send stage, kind, rank, receive stage, kind, rank) carrying ``action``'s output to another rank,
    or () when it stays on its rank (or goes nowhere)."""
    goes = output(action, stages)
    owners = program.owners[action[3]]
    if goes is None or owners[goes.stage] == owners[action[0]]:
        return ()
    if goes.send[2:] != action[2:] or goes.recv[2:] != action[2:]:
        raise ValueError(f"internal error: {action!r} sends {goes!r}, of another microbatch or chain")
    return goes.send[0], goes.send[1], owners[action[0]], goes.recv[0], goes.recv[1], owners[goes.stage]


def check_needed_comms(program: Program) -> list[Violation]:
    if comms_as_needed(program):
        return []
    needed = needed_comms(program)
    found = []
    present: set[ActionKey] = set()
    placed: set[tuple[ActionKey, int]] = set()
    bad = program.out_of_range
    for slot, key in program.actions():
        if role(key[1]) != "comm" or key in bad:
            continue
        if key not in needed and key not in present:
            found.append(violation_at("duplicate", f"{text_of(key)} is not needed: no cross-rank edge carries it",
                                      slot))
        present.add(key)
        placed.add((key, slot.rank))
    absent = [key for key, rank in needed.items() if (key, rank) not in placed]  # written elsewhere counts not
    for key in sorted(absent, key=lambda k: (needed[k], k[0], k[1], k[2], k[3])):
        rank = needed[key]
        found.append(Violation("missing", f"{text_of(key)} is needed on rank {rank} and never posted", rank))
    return found


def comms_as_needed(program: Program) -> bool:
    """The common case, decided rank by rank with sets: every action in range, and each rank posts
    exactly the sends and receives that ``needed_comms`` puts on it (a second post of one is
    ``check_duplicates``'), so ``check_needed_comms`` has nothing to report; when this says no, it walks
    the actions to find what. The compute actions are walked in program order, and each rank's sets
    stay small (one table of every needed op, looked up in hash order, cost four times as much)."""
    if program.out_of_range:
        return False
    stages = program.schedule.stages
    wanted: list[set[ActionKey]] = [set() for _ in program.slots]
    edges: dict[tuple, Edge] = {}
    for row in program.slots:
        for key in _flatten(map(_acts_of, _filterfalse(_group_of, row))):  # compute and stage-only steps
            stage, kind, mb, chain = key
            edge = edges.get((stage, kind, chain))
            if edge is None:
                edge = edges[(stage, kind, chain)] = cross_rank_edge(program, key, stages) \
                    if ROLES[kind] == "compute" else ()
            if edge:
                send_stage, send_kind, send_rank, recv_stage, recv_kind, recv_rank = edge
                wanted[send_rank].add((send_stage, send_kind, mb, chain))
                wanted[recv_rank].add((recv_stage, recv_kind, mb, chain))
    for row, keys in zip(program.slots, wanted, strict=True):
        if set(_flatten(_compress(map(_acts_of, row), map(_group_of, row)))) != keys:
            return False
    return True


# --- order ---------------------------------------------------------------------------------


def check_order(program: Program) -> list[Violation]:
    found = []
    for row in program.slots:
        found += check_rank_order(program, row)
    return found


def check_rank_order(program: Program, row: tuple[Slot, ...]) -> list[Violation]:
    """Each unmet need of an action on its own rank. A need is unmet when what it needs is on the
    rank, but not strictly earlier; when it is nowhere on the rank it is ``missing`` (or misplaced:
    ``placement``) and that is the one report. Actions on a rank that does not own their stage
    are ``placement`` only: nothing derived from them is checked."""
    done: set[ActionKey] = set()
    here = set(_flatten(map(_acts_of, row)))
    found = []
    bad = program.out_of_range
    stages = program.schedule.stages
    owners_of = program.owners
    shapes: dict[tuple[int, ActionKind, int], NeedShape] = {}  # (stage, kind, chain) -> its needs' shape
    for slot in row:
        rank = slot.rank
        for key in slot.acts:
            stage, kind, mb, chain = key
            if kind in NEEDLESS_KINDS or (bad and key in bad):
                continue
            owners = owners_of[chain]
            if owners[stage] != rank:
                continue
            shape = shapes.get((stage, kind, chain))
            if shape is None:
                shape = shapes[(stage, kind, chain)] = need_shape(key, stages, owners, rank)
            for need in shape:  # unmet: no alternative is done, and one is on the rank (so later)
                unmet = False
                for need_stage, need_kind in need:
                    alternative = (need_stage, need_kind, mb, chain)
                    if alternative in done:
                        unmet = False
                        break
                    unmet = unmet or alternative in here
                if unmet:
                    text = " or ".join(text_of((s, k, mb, chain)) for s, k in need)
                    found.append(violation_at("order", f"{text_of(key)} needs {text} earlier on rank {rank}", slot))
        done.update(slot.acts)
    return found


NeedShape = tuple[tuple[tuple[int, ActionKind], ...], ...]


def need_shape(key: ActionKey, stages: int, owners: tuple[int, ...], rank: int) -> NeedShape:
    """``semantics.local_needs`` of ``key`` with each alternative as (stage, kind). Every rule names
    actions of the action's own microbatch and chain (checked here), so one shape serves all the
    microbatches of a (stage, kind, chain) on a rank: the rules are asked once per shape, not once
    per action (a quarter of the check)."""
    shape = []
    for need in local_needs(key, stages, owners, rank):
        if any(alternative[2:] != key[2:] for alternative in need):
            raise ValueError(f"internal error: {key!r} needs {need!r}, of another microbatch or chain")
        shape.append(tuple(alternative[:2] for alternative in need))
    return tuple(shape)
