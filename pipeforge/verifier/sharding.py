"""The rules of the stage-only actions, plain Python (docs/semantics.md, "Parameters and gradients").

``check_sharding(program)`` -> the ``placement``, ``duplicate``, ``order`` and ``missing`` violations of
``REDUCE_GRAD``, ``UNSHARD`` and ``RESHARD``, which name a stage, not a microbatch: each on a rank holding
the stage; ``REDUCE_GRAD`` once per stage and rank, after the stage's last B or W there; ``UNSHARD`` and
``RESHARD`` actions alternating from an ``UNSHARD``, every compute of the stage between an ``UNSHARD`` and the
next ``RESHARD``, the last one a ``RESHARD``. Their memory is ``semantics.PARAMETER_MEMORY``'s, counted by
``memory.py``.
"""

from __future__ import annotations

from pipeforge.ir import COMPUTE_KINDS, STAGE_ONLY_KINDS, ActionKind
from pipeforge.semantics import GRADIENT_KINDS, ActionKey
from pipeforge.verifier.program import Program, Slot, text_of, violation_at
from pipeforge.verifier.report import Violation

SHARDING = frozenset({ActionKind.UNSHARD, ActionKind.RESHARD})


def holds_stage(program: Program, rank: int, stage: int) -> bool:
    """Whether ``rank`` holds ``stage`` in some chain."""
    return any(0 <= stage < len(owners) and owners[stage] == rank for owners in program.owners)


def stage_only_placement_problem(program: Program, slot: Slot, key: ActionKey) -> str | None:
    """An in-range stage-only action on a rank that holds no replica of its stage."""
    stage = key[0]
    if key[1] not in STAGE_ONLY_KINDS or holds_stage(program, slot.rank, stage):
        return None
    ranks = sorted({owners[stage] for owners in program.owners})
    where = " and ".join(map(str, ranks))
    return f"{text_of(key)} is on rank {slot.rank}, which holds no replica of stage {stage} (placed on rank {where})"


def check_sharding(program: Program) -> list[Violation]:
    """duplicate, order and missing of the stage-only actions, rank by rank."""
    found: list[Violation] = []
    for row in program.slots:
        last_grad, reduces, sharded = stage_rules_of(row)
        if reduces:
            found += check_reduce_grad(program, last_grad, reduces)
        if sharded:
            found += check_shard_windows(program, row, sharded)
    return found


def stage_rules_of(row: tuple[Slot, ...]) -> tuple[dict[int, int], list[tuple[Slot, ActionKey]], list[ActionKey]]:
    """One walk of a rank: per stage the number of its last slot holding a B or W of the stage; its
    REDUCE_GRADs; and its UNSHARDs and RESHARDs."""
    last: dict[int, int] = {}
    reduces = []
    sharded = []
    for slot in row:
        for key in slot.acts:
            kind = key[1]
            if kind in GRADIENT_KINDS:
                last[key[0]] = slot.number
            elif kind in STAGE_ONLY_KINDS:
                if kind in SHARDING:
                    sharded.append(key)
                elif kind is ActionKind.REDUCE_GRAD:
                    reduces.append((slot, key))
    return last, reduces, sharded


# --- REDUCE_GRAD ---------------------------------------------------------------------------


def check_reduce_grad(program: Program, last_grad: dict[int, int],
                      reduces: list[tuple[Slot, ActionKey]]) -> list[Violation]:
    """Once per stage on the rank, and after the stage's last B or W there (chains alike)."""
    first: dict[int, Slot] = {}
    found = []
    for slot, key in reduces:
        stage = key[0]
        if last_grad.get(stage, -1) >= slot.number:
            found.append(violation_at("order", f"{text_of(key)} comes before the last B/W of stage {stage} "
                                      f"on rank {slot.rank}", slot))
        if key in program.out_of_range:
            continue
        if stage in first:
            found.append(violation_at("duplicate", f"{text_of(key)} again on rank {slot.rank} (first at step "
                                      f"{first[stage].index}): a stage's gradients are reduced once", slot))
        first.setdefault(stage, slot)
    return found


# --- UNSHARD / RESHARD ---------------------------------------------------------------------


def check_shard_windows(program: Program, row: tuple[Slot, ...], sharded: list[ActionKey]) -> list[Violation]:
    """``sharded``: the rank's UNSHARDs and RESHARDs; the window rule applies to their stages (in range)."""
    stages = {key[0] for key in sharded if key not in program.out_of_range}
    if not stages:
        return []
    gathered: dict[int, bool] = dict.fromkeys(stages, False)
    last_unshard: dict[int, Slot] = {}
    found = []
    for slot in row:
        for key in slot.acts:
            if key[0] not in gathered or key in program.out_of_range:
                continue
            problem = window_problem(key, gathered[key[0]], slot.rank)
            if problem:
                found.append(violation_at("order", problem, slot))
            if key[1] == "UNSHARD":
                gathered[key[0]] = True
                last_unshard[key[0]] = slot
            elif key[1] == "RESHARD":
                gathered[key[0]] = False
    for stage in sorted(s for s, on in gathered.items() if on):
        slot = last_unshard[stage]
        found.append(Violation("missing", f"no RESHARD of stage {stage} on rank {slot.rank} after its UNSHARD at "
                               f"step {slot.index}: the parameters stay gathered", slot.rank))
    return found


def window_problem(key: ActionKey, gathered: bool, rank: int) -> str | None:
    stage, kind = key[0], key[1]
    if kind == "UNSHARD" and gathered:
        return f"{text_of(key)} on rank {rank}: stage {stage} is already unsharded (no RESHARD since its UNSHARD)"
    if kind == "RESHARD" and not gathered:
        return f"{text_of(key)} on rank {rank}: stage {stage} is not unsharded (no UNSHARD since its last RESHARD)"
    if kind in COMPUTE_KINDS and not gathered:
        return (f"{text_of(key)} on rank {rank} computes on stage {stage} while its parameters are sharded: "
                f"needs {stage}UNSHARD earlier, with no RESHARD between")
    return None
