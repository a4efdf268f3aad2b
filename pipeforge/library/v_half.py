"""V-Half (Qi et al. 2024, "Pipeline Parallelism with Controllable Memory"), built as its authors build it.

``build(P, M)`` -> the schedule: two stages a rank in a V, the backward split into I and W, from the
paper's V-Half building block repeated every 6 slots, warm-up and cool-down squeezed greedily as the
authors' ``zbv_greedy.py`` does, each rank holding at most P + 2 stage-microbatches of activations
(about half of 1F1B's). No closed form gives it, so the library builds it here. ``DESCRIPTION`` and
``PARAMETERS`` as the library asks. The construction: ``docs/library.md`` (V-Half).
"""

from __future__ import annotations

import heapq

from pipeforge.errors import SemanticError
from pipeforge.ir import Action, ActionKind, Placement, Schedule, Step

DESCRIPTION = ("V-shaped building block with half of 1F1B's activation memory, warm-up and cool-down "
               "squeezed greedily (V-Half, Qi et al. 2024)")
PARAMETERS = (("P", 4), ("M", 8))
MAX_ACTIONS = 30_000  # the greedy grows faster than the actions (P=64, M=128: 49k actions, a minute)

F_DOWN, F_UP, I_UP, I_DOWN, W_ALL = 0, 1, 2, 3, 4
W_UP, W_DOWN = 4, 5

Times = list[list[list[int]]]  # [rank][kind][microbatch] -> slot


def build(P: int, M: int) -> Schedule:
    """The V-Half schedule on P ranks and M microbatches (both at least 1)."""
    if P < 1 or M < 1:
        raise SemanticError(f"V-Half needs P and M at least 1, got P={P}, M={M}")
    if 6 * P * M > MAX_ACTIONS:
        raise SemanticError(f"V-Half with P={P}, M={M} has {6 * P * M} actions; at most {MAX_ACTIONS} are built")
    orders = per_rank_orders(P, M)
    programs = tuple(tuple(step_of(P, rank, kind, mb) for kind, mb in order) for rank, order in enumerate(orders))
    return Schedule("v_half", P, 2 * P, M, (Placement.v(2 * P, P),), programs, params=(("P", P), ("M", M)))


def per_rank_orders(P: int, M: int) -> list[list[tuple[int, int]]]:
    """Each rank's (kind, microbatch) in the order the squeezed schedule runs them."""
    times = [[list(range(start, start + 6 * M, 6)) for start in block] for block in building_block(P)]
    first = squeeze([weights_placed(rank) for rank in times], with_weights=True, microbatches=M)
    second = squeeze([rank[:4] for rank in first], with_weights=False, microbatches=M)
    final = [weights_placed(rank[:4], split=True) for rank in second]
    return execution_order(final)


def building_block(P: int) -> list[tuple[int, int, int, int]]:
    """Per rank, the slots of microbatch 0's forward down, forward up, I up and I down."""
    c = 3 if P % 2 == 0 else 0
    return [(2 * r, 3 * P - r - 2, 3 * P + c + 2 * r - 1, 6 * P + c - r - 2) for r in range(P)]


def step_of(P: int, rank: int, kind: int, mb: int) -> Step:
    down, up = rank, 2 * P - 1 - rank
    stage, action_kind = {F_DOWN: (down, ActionKind.F), F_UP: (up, ActionKind.F), I_UP: (up, ActionKind.I),
                          I_DOWN: (down, ActionKind.I), W_UP: (up, ActionKind.W), W_DOWN: (down, ActionKind.W)}[kind]
    return Step((Action(stage, action_kind, mb),))


# --- the weight backwards: the first free slots after their I -----------------------------


def weights_placed(rank: list[list[int]], split: bool = False) -> list[list[int]]:
    """The four compute lists and the Ws: each W in the first slot free of the four after an I is
    pending (split: the up stage's Ws first, then the down stage's, in two lists); Ws left over at
    the end follow one a slot."""
    events = sorted((slot, kind) for kind in range(4) for slot in rank[kind])
    taken = {slot for slot, _ in events}
    pending = [0, 0]
    weights: list[list[int]] = [[], []]
    end = events[-1][0] if events else -1
    cursor = 0
    for slot in range(end + 1):
        while cursor < len(events) and events[cursor][0] == slot:
            kind = events[cursor][1]
            if kind in (I_UP, I_DOWN):
                pending[kind - I_UP if split else 0] += 1
            cursor += 1
        if slot not in taken:
            for lane in (0, 1):
                if pending[lane]:
                    weights[lane].append(slot)
                    pending[lane] -= 1
                    break
    last = max(end, 0)
    for lane in (0, 1):
        for _ in range(pending[lane]):
            last += 1
            weights[lane].append(last)
    lists = [list(kind) for kind in rank[:4]] + [weights[0]]
    return lists + [weights[1]] if split else lists


def peak_memory(rank: list[list[int]]) -> int:
    """Most stage-microbatches held: a forward adds one, a W releases one; without W lists, each
    free slot releases one whose I is done (the Ws as they would be placed)."""
    has_weights = len(rank) > 4
    change = {F_DOWN: 1, F_UP: 1, I_UP: 0, I_DOWN: 0, W_ALL: -1, W_DOWN: -1}
    at: dict[int, int] = {}
    for kind, slots in enumerate(rank):
        for slot in slots:
            at[slot] = kind
    held = peak = pending = 0
    for slot in range(max((s[-1] for s in rank if s), default=-1) + 1):
        if slot in at:
            kind = at[slot]
            held += change[kind]
            pending += kind in (I_UP, I_DOWN)
        elif not has_weights and pending:
            held -= 1
            pending -= 1
        peak = max(peak, held)
    return peak


# --- the greedy squeeze ------------------------------------------------------------------


def squeeze(times: Times, *, with_weights: bool, microbatches: int) -> Times:
    """Move each action outside the steady state to its earliest free slot after its inputs that
    keeps the rank's peak; then re-time everything as soon as possible in the new order.

    Actions are taken in slot order. The steady state runs from rank 0's first I down to the
    first forward down of the last microbatch; without Ws only the cool-down after it moves.
    """
    times = [[list(kind) for kind in rank] for rank in times]
    budget = max(peak_memory(rank) for rank in times)
    occupied: list[set[int]] = [set() for _ in times]
    phase = 0
    for slot, rank, kind, mb in in_slot_order(times):
        if phase == 0 and kind == I_DOWN and rank == 0:
            phase = 1
        if phase == 1 or (phase == 0 and not with_weights):
            if phase == 1 and kind == F_DOWN and mb == microbatches - 1:
                phase = 2
            occupied[rank].add(slot)
            continue
        earliest = inputs_ready(times, rank, kind, mb) + 1
        chosen = slot
        for candidate in range(earliest, slot):
            if candidate in occupied[rank]:
                continue
            times[rank][kind][mb] = candidate
            if peak_memory(times[rank]) <= budget:
                chosen = candidate
                break
        times[rank][kind][mb] = chosen
        occupied[rank].add(chosen)
    if not with_weights:
        times = [weights_placed(rank) for rank in times]
    return start_times(times)


def in_slot_order(times: Times):
    """(slot, rank, kind, mb) in slot order, ties by rank, kind, microbatch; a list's next
    microbatch enters once the previous one is taken, so a moved action is seen at its new slot."""
    heap = [(times[r][k][0], r, k, 0) for r in range(len(times)) for k in range(len(times[r])) if times[r][k]]
    heapq.heapify(heap)
    while heap:
        slot, rank, kind, mb = heapq.heappop(heap)
        slot = times[rank][kind][mb]
        yield slot, rank, kind, mb
        if mb + 1 < len(times[rank][kind]):
            heapq.heappush(heap, (times[rank][kind][mb + 1], rank, kind, mb + 1))


def inputs_ready(times: Times, rank: int, kind: int, mb: int) -> int:
    """The latest slot among what the action waits for (-1 for none)."""
    ready = -1
    if kind in (F_DOWN, I_UP) and rank > 0:
        ready = max(ready, times[rank - 1][kind][mb])
    if kind in (F_UP, I_DOWN) and rank + 1 < len(times):
        ready = max(ready, times[rank + 1][kind][mb])
    if 0 < kind < 4:
        ready = max(ready, times[rank][kind - 1][mb])
    if kind == W_ALL:
        ready = max(ready, sorted(times[rank][I_UP] + times[rank][I_DOWN])[mb])
    if mb > 0:
        ready = max(ready, times[rank][kind][mb - 1])
    return ready


def start_times(times: Times) -> Times:
    """Every action re-timed as soon as possible (unit durations) in slot order."""
    end: dict[tuple[int, int, int], int] = {}
    last_on: dict[int, tuple[int, int, int]] = {}
    for _, rank, kind, mb in ordered(times):
        ready = 0
        if kind in (F_DOWN, I_UP) and rank > 0:
            ready = end[(rank - 1, kind, mb)]
        if kind in (F_UP, I_DOWN) and rank + 1 < len(times):
            ready = max(ready, end[(rank + 1, kind, mb)])
        if 0 < kind < 4:
            ready = max(ready, end[(rank, kind - 1, mb)])
        if mb > 0:
            ready = max(ready, end[(rank, kind, mb - 1)])
        if rank in last_on:
            ready = max(ready, end[last_on[rank]])
        end[(rank, kind, mb)] = ready + 1
        last_on[rank] = (rank, kind, mb)
    return [[[end[(r, k, m)] - 1 for m in range(len(times[r][k]))] for k in range(len(times[r]))]
            for r in range(len(times))]


def ordered(times: Times) -> list[tuple[int, int, int, int]]:
    return sorted((slot, r, k, m) for r, rank in enumerate(times) for k, slots in enumerate(rank)
                  for m, slot in enumerate(slots))


def execution_order(times: Times) -> list[list[tuple[int, int]]]:
    """Each rank's (kind, microbatch) in slot order, ties by kind then microbatch."""
    orders: list[list[tuple[int, int]]] = [[] for _ in times]
    for _, rank, kind, mb in ordered(times):
        orders[rank].append((kind, mb))
    return orders
