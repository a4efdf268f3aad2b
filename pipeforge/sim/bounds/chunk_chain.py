"""The chunk chain: a memory chain for ranks that hold several stages of one chain (V, interleaved).

``chunk_chain_spans(graph, limit, paths)``: for each rank, a lower bound on its span in every schedule
of the work within the memory limit (space 2 of ``pipeforge.sim.bounds``; ``work.rank_spans`` keeps
the largest argument), counting that a microbatch holds an activation of every stage of the rank for
part of its round trip; 0 where it says nothing (no limit, a rank with one stage, ...). The proof:
``docs/bounds.md`` (The chunk chain).
"""

from __future__ import annotations

import math
from collections import Counter
from typing import NamedTuple

from pipeforge.ir import ActionKind
from pipeforge.sim.bounds.paths import Paths
from pipeforge.sim.workgraph import WorkGraph

_F, _I, _W = ActionKind.F, ActionKind.I, ActionKind.W
TOLERANCE = 1e-9


def chunk_chain_spans(graph: WorkGraph, limit: float | None, paths: Paths) -> list[float]:
    """Per rank, the chunk chain bound on its span (0 where nothing is said: no limit, several chains, a rank
    with one stage, work without I, a limit below what one microbatch holds on the rank)."""
    ranks = graph.shape.ranks
    count = graph.memory.count_limit(limit, graph.shape.stages) if limit is not None else None
    if count is None or math.isinf(count) or len(graph.shape.placements) != 1 or not graph.actions:
        return [0.0] * ranks
    weights = graph.memory.least_weights(graph.shape.stages)
    lanes = Counter((r, a.stage) for a, r in zip(graph.actions, graph.rank) if a.kind is _F)
    return [_rank_chain(graph, paths, r, count, weights, lanes) for r in range(ranks)]


def _rank_chain(graph: WorkGraph, paths: Paths, r: int, count: float, weights: float, lanes: Counter) -> float:
    actions, least = graph.actions, paths.least
    mine = {(actions[a].stage, actions[a].kind): a for a in paths.members if graph.rank[a] == r}
    stages = sorted({stage for stage, kind in mine if kind is _F})
    if len(stages) < 2 or count < len(stages) - TOLERANCE:
        return 0.0
    low, top = stages[0], stages[-1]
    f_low, f_top, i_low = mine[(low, _F)], mine[(top, _F)], mine.get((low, _I))
    i_top, w_low, w_top = mine.get((top, _I)), mine.get((low, _W)), mine.get((top, _W))
    if i_low is None or i_top is None:
        return 0.0
    from_low, from_top = paths.from_start_of(f_low, least), paths.from_start_of(f_top, least)
    shape = _Shape(
        forward=least[f_low], down=from_low[f_top], back=from_top[i_low] + least[i_low],
        trip=from_low[i_low] + least[i_low], weight=least[w_low] if w_low is not None else 0.0,
        top_gone=_top_gone(from_top, least, i_top, w_top, count, weights, len(stages)),
        work=sum(least[a] for a in mine.values()))
    return _chain(shape, lanes[(r, low)], count, len(stages), weights)


def _top_gone(from_top: dict[int, float], least: dict[int, float], i_top: int, w_top: int | None,
              count: float, weights: float, held: int) -> float:
    """T1: from F(t) start until its unit is gone (its I ends; its W too when q + 2 units and a residue do
    not fit, q = floor(L - h))."""
    q = math.floor(count - held + TOLERANCE)
    if w_top is not None and count < q + 2 + weights - TOLERANCE:
        return from_top[w_top] + least[w_top]
    return from_top[i_top] + least[i_top]


class _Shape(NamedTuple):
    """One microbatch's least times on the rank (see the module doc: F(s), D1, D2, R, w_s, T1, and its work)."""

    forward: float
    down: float
    back: float
    trip: float
    weight: float
    top_gone: float
    work: float  # all of its F, I and W on the rank


def _chain(shape: _Shape, lanes: int, count: float, held: int, weights: float) -> float:
    """``E_{m-1} + w_s`` of the recurrences in the module doc (``held``: h, the rank's stages), or
    ``A_j`` plus the work of microbatches ``j..m-1`` where that is more."""
    open_at_a = math.floor(count - 1 + TOLERANCE)          # others open at an a_j
    open_at_b = math.floor(count - held + TOLERANCE)       # others open at a b_j
    pending_at_a = _pending(count - 1, weights)            # others not past their W(s) at an a_j
    pending_at_b = _pending(count - held, weights)
    a: list[float] = []
    b: list[float] = []
    e: list[float] = []
    for j in range(lanes):
        start = a[-1] + shape.forward if a else 0.0
        start = max(start, _after(e, j, open_at_a, 0.0), _after(e, j, pending_at_a, shape.weight))
        if j > open_at_b:  # of q + 2 microbatches open at a_j, the first to close ran its F(t) before a_j
            start = max(start, min(e[j - open_at_b - 1], b[j - open_at_b - 1] + shape.top_gone))
        top = max(start + shape.down, _after(e, j, open_at_b, 0.0), _after(e, j, pending_at_b, shape.weight))
        a.append(start)
        b.append(top)
        e.append(max(start + shape.trip, top + shape.back))
    # every action of microbatches j..m-1 on the rank follows their F(s), so comes after a_j
    filled = max((start + (lanes - j) * shape.work for j, start in enumerate(a)), default=0.0)
    return max(e[-1] + shape.weight, filled) if e else 0.0


def _pending(room: float, weights: float) -> int | None:
    """How many microbatches past their I but not their W fit in ``room`` units (None: any number)."""
    return math.floor(room / weights + TOLERANCE) if weights > 0 else None


def _after(ends: list[float], j: int, others: int | None, extra: float) -> float:
    """At most ``others`` of microbatches ``0..j-1`` still hold: one of index ``>= j - others - 1`` is done,
    so ``E`` of that index plus ``extra`` (0 when the pigeonhole says nothing)."""
    if others is None or j - others - 1 < 0:
        return 0.0
    return ends[j - others - 1] + extra
