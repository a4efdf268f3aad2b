"""Local search over compute orders: relocate one action on its rank, keep it when it helps.

A move takes the action at position ``p`` of a rank and reinserts it at ``q``
(|p - q| <= ``window``): a W moved into an earlier or later gap, an F pulled
into the warm-up, two adjacent independent steps swapped (|p - q| = 1). A move
is kept when the order still runs (no rank waits forever, which also rejects
any move that breaks a dependency on the rank), still fits the memory limit,
and lowers the key (worst span, then total span, then makespan).

Evaluation is cheap where it can be: the memory prefix of the one changed rank
is checked first (O(steps of that rank)); the timing is re-simulated only from
the first changed step on, since nothing that starts earlier can depend on it
(durations are positive), so the earlier part of every rank is reused.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from pipeforge.optimize.evaluate import TOLERANCE, Evaluation, Graph, Order, evaluate, simulate_order

Progress = Callable[[float, str], None]


@dataclass(frozen=True)
class LocalSearchResult:
    order: Order
    evaluation: Evaluation
    moves: int
    sweeps: int


def relocate(sequence: tuple[int, ...], p: int, q: int) -> tuple[int, ...]:
    """``sequence`` with the item at ``p`` moved to index ``q``."""
    items = list(sequence)
    item = items.pop(p)
    items.insert(q, item)
    return tuple(items)


def fits_memory(graph: Graph, sequence: tuple[int, ...], limit: float | None) -> bool:
    if limit is None:
        return True
    held = 0.0
    for a in sequence:
        held += graph.delta[a]
        if held > limit + TOLERANCE:
            return False
    return True


def same_rank_order_ok(graph: Graph, sequence: tuple[int, ...], lo: int, hi: int) -> bool:
    """No action in ``lo..hi`` comes before a dependency of its own rank (a quick filter)."""
    placed = {a: i for i, a in enumerate(sequence[: hi + 1])}
    for i in range(lo, hi + 1):
        for d, _ in graph.deps[sequence[i]]:
            j = placed.get(d)
            if graph.rank[d] == graph.rank[sequence[i]] and (j is None or j > i):
                return False
    return True


class _Searcher:
    def __init__(self, graph: Graph, order: Order, window: int, deadline: float, progress: Progress | None):
        self.graph, self.window, self.deadline, self.progress = graph, window, deadline, progress
        self.limit = graph.problem.memory_limit
        self.order = order
        self.best = evaluate(graph, order)
        if self.best is None:
            raise ValueError("local search needs an order that runs")
        self.moves = 0
        self.started = time.monotonic()

    def out_of_time(self) -> bool:
        return time.monotonic() >= self.deadline

    def try_move(self, r: int, p: int, q: int) -> bool:
        seq = relocate(self.order[r], p, q)
        lo, hi = min(p, q), max(p, q)
        if not same_rank_order_ok(self.graph, seq, lo, hi) or not fits_memory(self.graph, seq, self.limit):
            return False
        candidate = self.order[:r] + (seq,) + self.order[r + 1:]
        result = evaluate(self.graph, candidate)
        if result is None or not result.fits(self.limit) or result.key() >= self.best.key():
            return False
        self.order, self.best = candidate, result
        self.moves += 1
        return True

    def sweep(self) -> bool:
        """One pass over every rank (worst span first) and position; True if anything improved."""
        improved = False
        ranks = sorted(range(len(self.order)), key=lambda r: -self.best.spans[r])
        for r in ranks:
            for p in range(len(self.order[r])):
                if self.out_of_time():
                    return improved
                improved |= self.improve_position(r, p)
        return improved

    def improve_position(self, r: int, p: int) -> bool:
        n = len(self.order[r])
        for q in range(max(0, p - self.window), min(n, p + self.window + 1)):
            if q != p and self.try_move(r, p, q):
                return True
        return False

    def report(self, sweeps: int) -> None:
        if self.progress is None:
            return
        budget = max(self.deadline - self.started, 1e-9)
        fraction = min(1.0, (time.monotonic() - self.started) / budget)
        self.progress(fraction, f"local search sweep {sweeps}: bubble {self.best.bubble_rate:.4f}")


def local_search(graph: Graph, order: Order, *, time_limit: float = 10.0, window: int = 8,
                 progress: Progress | None = None) -> LocalSearchResult:
    """Improve ``order`` by single-action relocations until none helps or time runs out."""
    searcher = _Searcher(graph, order, window, time.monotonic() + time_limit, progress)
    sweeps = 0
    while not searcher.out_of_time():
        sweeps += 1
        improved = searcher.sweep()
        searcher.report(sweeps)
        if not improved:
            break
    return LocalSearchResult(searcher.order, searcher.best, searcher.moves, sweeps)


__all__ = ["LocalSearchResult", "local_search", "relocate", "fits_memory", "simulate_order"]
