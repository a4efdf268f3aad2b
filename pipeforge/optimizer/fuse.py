"""Keep a B whole or split it: per (stage, microbatch), where the costs say B differs from I + W.

``FuseSearch(split, deadline, target).run(seeds, local=True)`` -> the best ``(graph, order, evaluation)``
found, or None: from each seed as it is and with its least work (every pair fused where B < I + W,
every B split where B > I + W), descents that fuse an I and its W into one B or split a B, keeping a
move when the order runs, fits the memory limit and lowers ``Evaluation.key``; with ``local``,
alternating with local search on the mix. Only stages where B and I + W differ move
(``choice_stages``). A move is timed on a mix of the split work (``mixed.py``). The moves:
``docs/optimize.md`` (Keeping B whole; The fuse search).
"""

from __future__ import annotations

import time
from bisect import bisect_left
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import cached_property

from pipeforge.ir import ActionKind
from pipeforge.optimizer.evaluate import TOLERANCE, Evaluation, Graph, Order, Problem, evaluate, metrics, simulate_order
from pipeforge.optimizer.local import fits_memory, local_search
from pipeforge.optimizer.mixed import MixedWork
from pipeforge.semantics import SPLIT
from pipeforge.sim.workgraph import Times

B = ActionKind.B
I, W = SPLIT[B]  # noqa: E741  (B's parts: the I node stands for the fused B, its W is left out)
Progress = Callable[[float, str], None]
Found = tuple[Graph, Order, Evaluation]


def fusable_stages(problem: Problem) -> frozenset[int]:
    """The stages whose fused B costs less than their I and W together."""
    cost = problem.costs.duration
    return frozenset(s for s in range(problem.stages) if cost(B, s) < _parts(problem, s) - TOLERANCE)


def choice_stages(problem: Problem) -> frozenset[int]:
    """The stages where keeping B whole or splitting it changes the work (B differs from I + W)."""
    cost = problem.costs.duration
    return frozenset(s for s in range(problem.stages) if abs(cost(B, s) - _parts(problem, s)) > TOLERANCE)


def _parts(problem: Problem, stage: int) -> float:
    """What B's parts (``semantics.SPLIT``: I and W) cost together on ``stage``."""
    return sum(problem.costs.duration(kind, stage) for kind in SPLIT[B])


@dataclass(frozen=True)
class Mix:
    """One set of actions and its order (``mixed.py``), timed: the fused I nodes, the graph that times
    them, the order, its times and metrics."""

    fused: frozenset[int]
    view: Graph
    order: Order
    timing: Times
    evaluation: Evaluation

    @cached_property
    def starts(self) -> tuple[list[float], ...]:
        """Each rank's start times in its order (for ``kept_before``: only the mixes moves are made from)."""
        start = self.timing.start
        return tuple([start[a] for a in seq] for seq in self.order)

    def kept_before(self, r: int, lo: int) -> list[int]:
        """Per rank, how many leading actions start before position ``lo`` of rank ``r`` (they keep their times
        when rank ``r`` changes from ``lo`` on)."""
        t0 = self.starts[r][lo]
        kept = [bisect_left(starts, t0) for starts in self.starts]
        kept[r] = lo
        return kept

    def idle(self) -> frozenset[int]:
        """The nodes whose rank is idle just before them (they wait for another rank)."""
        start, end = self.timing.start, self.timing.end
        return frozenset(seq[q] for seq in self.order for q in range(1, len(seq))
                         if start[seq[q]] - end[seq[q - 1]] > TOLERANCE)


# A candidate: the fused I nodes, the graph that times them, the order, and where it first differs from the
# mix it was made from (rank, position), or None for a new start.
Candidate = tuple[frozenset[int], Graph, Order, tuple[int, int] | None]


def least_work(work: MixedWork, fused: frozenset[int], order: Order, fuse: frozenset[int],
               split: frozenset[int]) -> tuple[frozenset[int], Order]:
    """Every pair of stages ``fuse`` fused at its I's position, every B of stages ``split`` split (its W
    right after its I): the seed's least work."""
    actions, weight_of = work.split.actions, work.weight_of
    now, out = set(fused), []
    for seq in order:
        nodes = []
        for node in seq:
            stage, kind = actions[node].stage, actions[node].kind
            if kind is W and stage in fuse:
                continue
            nodes.append(node)
            if kind is I and stage in fuse:
                now.add(node)
            elif node in now and stage in split:
                now.discard(node)
                nodes.append(weight_of[node])
        out.append(tuple(nodes))
    return frozenset(now), tuple(out)


def moves_of(work: MixedWork, mix: Mix, r: int, p: int, idle: frozenset[int]) -> Iterator[Candidate]:
    """The moves of the I node at position ``p`` of rank ``r``: fused with its W (at the I, at the W
    unless that is the next position) where it is split; split where it stands for its B, its W right
    after it, before each later node in ``idle`` (one its rank waits for: a gap the W may fill) and at
    the end of the rank."""
    seq, node = mix.order[r], mix.order[r][p]
    w = work.weight_of[node]
    if node not in mix.fused:
        fused, view = mix.fused | {node}, work.flip(mix.view, node, True)
        q = seq.index(w, p + 1)
        yield fused, view, _with(mix.order, r, seq[:q] + seq[q + 1:]), (r, p)
        if q > p + 1:  # else the W's position is the I's: the same order
            yield fused, view, _with(mix.order, r, seq[:p] + seq[p + 1:q] + (node,) + seq[q + 1:]), (r, p)
        return
    fused, view = mix.fused - {node}, work.flip(mix.view, node, False)
    for q in dict.fromkeys([p + 1] + [q for q in range(p + 2, len(seq)) if seq[q] in idle] + [len(seq)]):
        yield fused, view, _with(mix.order, r, seq[:q] + (w,) + seq[q:]), (r, p)


def _with(order: Order, r: int, seq: tuple[int, ...]) -> Order:
    return order[:r] + (seq,) + order[r + 1:]


class FuseSearch:
    """Fuse descents alternating with local search on the mixed actions, until neither improves.

    ``moves`` counts the candidates judged (what ``benchmarks/optimize/fuse.py`` reports per second)."""

    def __init__(self, split: Graph, deadline: float, target: float, progress: Progress | None = None):
        self.work = MixedWork(split)
        self.problem = problem = split.problem
        self.deadline, self.target, self.progress = deadline, target, progress
        self.fusable = fusable_stages(problem)
        self.stages = choice_stages(problem)  # what the moves touch
        self.limit = problem.memory_limit
        self.moves = 0

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def reached(self, evaluation: Evaluation) -> bool:
        return evaluation.max_span <= self.target + TOLERANCE

    def judge(self, candidate: Candidate, base: Mix | None = None) -> Mix | None:
        """``candidate`` timed (from its first change on where ``base`` is the mix it was made from), or
        None when it cannot run to the end or holds more than the memory limit."""
        fused, view, order, changed = candidate
        self.moves += 1
        reuse = since = None
        if changed is not None and base is not None:
            r, lo = changed
            if not fits_memory(view, order[r], self.limit):
                return None
            reuse, since = (base.timing, base.kept_before(r, lo)), (base.evaluation, r)
        timing = simulate_order(view, order, reuse)
        if timing is None:
            return None
        evaluation = metrics(view, order, timing, since)
        if not evaluation.fits(self.limit):
            return None
        return Mix(fused, view, order, timing, evaluation)

    def starts(self, seeds: list[tuple[Graph, Order]]) -> list[Mix]:
        """Each seed as it is and with its least work (``least_work``) that runs and fits, the best first."""
        found = []
        for graph, order in seeds:
            seed = self.work.mix_of(graph, order)
            least = least_work(self.work, *seed, self.fusable, self.stages - self.fusable)
            for fused, mixed in (seed, least):
                mix = self.judge((fused, self.work.view(fused), mixed, None))
                if mix is not None:
                    found.append(mix)
        return sorted(found, key=lambda mix: mix.evaluation.key())

    def run(self, seeds: list[tuple[Graph, Order]], local: bool = True) -> Found | None:
        """The best order found from ``seeds`` (each also with its least work), or None: a descent from
        each start, the best first (the best start is often a local optimum of the split work that no
        single move leaves, while the input's least work is not); then, with ``local``, from each descent's
        end, the best first, local search alternating with descents (``improve``). Without ``local`` (the
        cheap pass after explicit greedy or exact search) the descents alone."""
        if not self.fusable:
            return None
        starts = self.starts(seeds)
        if not starts:
            return None
        ends: list[Mix] = []
        for start in starts:
            if self.left() <= 0 or (ends and self.reached(ends[0].evaluation)):
                break
            ends.append(self.descend(start)[0])
            ends.sort(key=lambda mix: mix.evaluation.key())
        best = min(ends + starts[:1], key=lambda mix: mix.evaluation.key())
        for end in ends if local else ():
            if self.left() <= 0 or self.reached(best.evaluation):
                break
            found = self.improve(end, descended=True)
            if found.evaluation.key() < best.evaluation.key():
                best = found
        graph, order = self.work.compiled(best.view, best.order)
        evaluation = evaluate(graph, order)
        assert evaluation is not None, "the mix ran in its view: its actions in the same order run here too"
        return graph, order, evaluation

    def descend(self, best: Mix) -> tuple[Mix, bool]:
        """Sweeps over every (stage, microbatch) of a stage in ``choice_stages``, keeping the first of its moves
        that lowers the key, until a sweep keeps none; returns the best and whether anything changed."""
        improved, changed = True, False
        actions = self.work.split.actions
        while improved and self.left() > 0 and not self.reached(best.evaluation):
            improved = False
            targets = [(r, node, node in best.fused) for r, seq in enumerate(best.order) for node in seq
                       if actions[node].kind is I and actions[node].stage in self.stages]
            idle = best.idle()
            for r, node, fused in targets:
                if self.left() <= 0 or self.reached(best.evaluation):
                    break
                if (node in best.fused) != fused:
                    continue  # an earlier move of this sweep fused or split it
                found = self.first_better(best, r, best.order[r].index(node), idle)
                if found is not None:
                    best, improved, changed = found, True, True
                    idle = best.idle()
        return best, changed

    def first_better(self, best: Mix, r: int, p: int, idle: frozenset[int]) -> Mix | None:
        """The first move of the node at position ``p`` of rank ``r`` that lowers the key, if any."""
        key = best.evaluation.key()
        for candidate in moves_of(self.work, best, r, p, idle):
            if self.left() <= 0:
                return None
            found = self.judge(candidate, best)
            if found is not None and found.evaluation.key() < key:
                return found
        return None

    def improve(self, best: Mix, descended: bool = False) -> Mix:
        """Fuse descents alternating with local search from ``best`` (the end of a descent where
        ``descended``: local search first), until neither improves."""
        while self.left() > 0 and not self.reached(best.evaluation):
            if self.progress is not None:
                self.progress(0.4, f"fuse search: best bubble {best.evaluation.bubble_rate:.4f}")
            best, changed = (best, False) if descended else self.descend(best)
            descended = False
            if self.left() <= 0 or self.reached(best.evaluation):
                break
            local = local_search(best.view, best.order, time_limit=self.left(), target=self.target, kicks=5)
            if local.evaluation.key() < best.evaluation.key():
                best = self.judge((best.fused, best.view, local.order, None)) or best
            elif not changed:
                break
        return best


__all__ = ["FuseSearch", "Mix", "choice_stages", "fusable_stages", "least_work", "moves_of"]
