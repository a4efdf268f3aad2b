"""Local search over compute orders: move actions on their rank, keep a move when it helps.

``local_search(graph, order, time_limit=..., window=..., kicks=...)`` -> ``LocalSearchResult``: an order
of the same actions that still runs, fits the memory limit and has a key (worst span, total span,
makespan, then the sum of all ends) no larger than the input's. The moves, and why a move costs only a
partial re-timing: ``docs/optimize.md`` (Local search).
"""

from __future__ import annotations

import random
import time
from bisect import bisect_left
from collections.abc import Callable
from dataclasses import dataclass

from pipeforge.ir import ActionKind
from pipeforge.optimizer.evaluate import TOLERANCE, Evaluation, Graph, Order, metrics, simulate_order
from pipeforge.sim.workgraph import Times, peak_memory
from pipeforge.semantics import within_limit

Progress = Callable[[float, str], None]
F, W = ActionKind.F, ActionKind.W
EARLY = (F, ActionKind.R)  # what a gap may be filled with from later on (an R: its rebuild run ahead, Mario-style)
GAP_TRIES = 12


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


def exchange(sequence: tuple[int, ...], p: int, q: int) -> tuple[int, ...]:
    """``sequence`` with the items at ``p`` and ``q`` swapped."""
    items = list(sequence)
    items[p], items[q] = items[q], items[p]
    return tuple(items)


def fits_memory(graph: Graph, sequence: tuple[int, ...], limit: float | None) -> bool:
    """A rank's ``sequence`` within ``limit``: its peak as simulate and ``Evaluation.fits`` count it
    (``workgraph.peak_memory``, the walk of ``semantics.held_after_additions``)."""
    return within_limit(peak_memory(graph, sequence), limit)


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
        timing = simulate_order(graph, order)
        if timing is None:
            raise ValueError("local search needs an order that runs")
        self.accept(order, timing, metrics(graph, order, timing))
        self.moves = 0
        self.started = time.monotonic()
        self.record: Evaluation | None = None  # the best of earlier descents (for progress)

    def out_of_time(self) -> bool:
        return time.monotonic() >= self.deadline

    def accept(self, order: Order, timing: Times, evaluation: Evaluation) -> None:
        self.order, self.timing, self.best = order, timing, evaluation
        self.starts = [[timing.start[a] for a in seq] for seq in order]

    def kept_before(self, r: int, lo: int) -> list[int]:
        """Per rank, how many leading actions started before the first changed one (they keep their times)."""
        t0 = self.starts[r][lo]
        kept = [bisect_left(starts, t0) for starts in self.starts]
        kept[r] = lo
        return kept

    def try_move(self, r: int, p: int, q: int, move=relocate) -> bool:
        seq = move(self.order[r], p, q)
        lo, hi = min(p, q), max(p, q)
        if not same_rank_order_ok(self.graph, seq, lo, hi) or not fits_memory(self.graph, seq, self.limit):
            return False
        candidate = self.order[:r] + (seq,) + self.order[r + 1:]
        timing = simulate_order(self.graph, candidate, (self.timing, self.kept_before(r, lo)))
        if timing is None:
            return False
        result = metrics(self.graph, candidate, timing, (self.best, r))
        if not result.fits(self.limit) or result.key() >= self.best.key():
            return False
        self.accept(candidate, timing, result)
        self.moves += 1
        return True

    def sweep(self) -> bool:
        """One pass over every rank (worst span first) and position; True if anything improved."""
        improved = False
        ranks = sorted(range(len(self.order)), key=lambda r: -self.best.spans[r])
        for r in ranks:
            improved |= self.fill_gaps(r)
            for p in range(len(self.order[r])):
                if self.out_of_time():
                    return improved
                improved |= self.improve_position(r, p)
        return improved

    def gaps(self, r: int) -> list[int]:
        """Positions on rank r whose action waits after the previous one ends."""
        seq, start, end = self.order[r], self.timing.start, self.timing.end
        return [q for q in range(1, len(seq)) if start[seq[q]] - end[seq[q - 1]] > TOLERANCE]

    def fill_gaps(self, r: int) -> bool:
        """Pull a W from anywhere earlier, or an F (or R) from later, into each idle gap of rank r."""
        improved = False
        for q in reversed(self.gaps(r)):
            if self.out_of_time():
                break
            improved |= self.fill_gap(r, q)
        return improved

    def fill_gap(self, r: int, q: int) -> bool:
        seq, kinds = self.order[r], self.graph.actions
        later_w = [p for p in range(q - 1, -1, -1) if kinds[seq[p]].kind is W][:GAP_TRIES]
        for p in later_w:
            if self.try_move(r, p, q - 1):
                return True
        earlier_f = [p for p in range(q + 1, len(seq)) if kinds[seq[p]].kind in EARLY][:GAP_TRIES]
        return any(self.try_move(r, p, q) for p in earlier_f)

    def improve_position(self, r: int, p: int) -> bool:
        n = len(self.order[r])
        for q in range(max(0, p - self.window), min(n, p + self.window + 1)):
            if q != p and self.try_move(r, p, q):
                return True
        for q in range(p + 2, min(n, p + self.window + 1)):
            if self.try_move(r, p, q, exchange):
                return True
        return False

    def descend(self) -> int:
        """Sweeps until none improves (or time runs out); returns how many ran."""
        sweeps = 0
        while not self.out_of_time():
            sweeps += 1
            improved = self.sweep()
            self.report(sweeps)
            if not improved:
                break
        return sweeps

    def kick(self, order: Order, rng: random.Random, size: int = 3) -> None:
        """Restart from ``order`` moved by ``size`` random valid relocations."""
        for _ in range(size * 20):
            if size == 0:
                break
            r = rng.randrange(len(order))
            n = len(order[r])
            if n < 2:
                continue
            p, q = rng.randrange(n), rng.randrange(n)
            seq = relocate(order[r], p, q)
            candidate = order[:r] + (seq,) + order[r + 1:]
            if p != q and fits_memory(self.graph, seq, self.limit) and simulate_order(self.graph, candidate):
                order, size = candidate, size - 1
        timing = simulate_order(self.graph, order)
        assert timing is not None, "kicked from the best order by moves that each ran"
        self.accept(order, timing, metrics(self.graph, order, timing))

    def report(self, sweeps: int) -> None:
        if self.progress is None:
            return
        budget = max(self.deadline - self.started, 1e-9)
        fraction = min(1.0, (time.monotonic() - self.started) / budget)
        record = self.best if self.record is None or self.best.key() < self.record.key() else self.record
        self.progress(fraction, f"local search sweep {sweeps}: best bubble {record.bubble_rate:.4f}")


def local_search(graph: Graph, order: Order, *, time_limit: float = 10.0, window: int = 8, kicks: int = 20,
                 seed: int = 0, target: float | None = None, progress: Progress | None = None) -> LocalSearchResult:
    """Improve ``order`` by moves until none helps, then kick and descend again (iterated local search).

    A kick applies a few random valid moves to the best order so far, whatever
    they cost; the descent from there is kept only if it ends better. It stops
    after ``kicks`` kicks in a row without gain, at the time limit, or when the
    worst span reaches ``target`` (a proven lower bound). Deterministic for a ``seed``.
    """
    searcher = _Searcher(graph, order, window, time.monotonic() + time_limit, progress)
    rng = random.Random(seed)
    sweeps = searcher.descend()
    best_order, best, failures = searcher.order, searcher.best, 0
    searcher.record = best
    while failures < kicks and not searcher.out_of_time() and not _reached(best, target):
        searcher.kick(best_order, rng)
        sweeps += searcher.descend()
        if searcher.best.key() < best.key():
            best_order, best, failures = searcher.order, searcher.best, 0
            searcher.record = best
        else:
            failures += 1
    return LocalSearchResult(best_order, best, searcher.moves, sweeps)


def _reached(best: Evaluation, target: float | None) -> bool:
    return target is not None and best.max_span <= target + TOLERANCE


__all__ = ["LocalSearchResult", "local_search", "relocate", "exchange", "fits_memory"]
