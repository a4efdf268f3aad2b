"""Keep a B whole or split it: per (stage, microbatch), where the costs say B differs from I + W.

The other strategies reorder one fixed set of actions, every B split into I
and W (the Zero Bubble split). Where a stage's fused B costs less than its I
and W together (measured costs often do: one backward pass reuses what the two
halves each recompute), the best schedule keeps most backwards fused and splits
only those whose W fills a bubble. This search changes the set of actions:

- **fuse** (stage, microbatch): its I and W become one B, at the I's position
  or at the W's;
- **split** (stage, microbatch): its B becomes an I at the B's position and a
  W right after it, or before a later action its rank waits for (a gap the W
  may fill), or at the end of the rank.

It runs where some stage's B < I + W, and moves the (stage, microbatch) of
every stage where B and I + W differ (where B > I + W a split is the cheaper
one: a fused B in the input is split there); where B = I + W (the Zero Bubble
tables) a fused B at the I's position times exactly like the I with its W
right after it, so nothing here could gain and nothing runs. Each seed is
tried as it is and with its least work: every pair fused where B < I + W and
every B split (its W right after its I) where B > I + W. A move is kept
when the order still runs, fits the memory limit and lowers the evaluation key
(``Evaluation.key``), as in local search. Every changed set of actions gets its
own work graph (``Graph``: the memory of a fused B is ``MemorySpec.stage_effect``'s,
the semantics' one rule); between fuse descents, local search reorders the
mixed set (``local.local_search``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

from pipeforge.ir import Action, ActionKind
from pipeforge.optimizer.evaluate import TOLERANCE, Evaluation, Graph, Order, Problem, evaluate, simulate_order

F, B, I, W = ActionKind.F, ActionKind.B, ActionKind.I, ActionKind.W  # noqa: E741
Programs = tuple[tuple[Action, ...], ...]
Progress = Callable[[float, str], None]


def fusable_stages(problem: Problem) -> frozenset[int]:
    """The stages whose fused B costs less than their I and W together."""
    cost = problem.costs.duration
    return frozenset(s for s in range(problem.stages) if cost(B, s) < cost(I, s) + cost(W, s) - TOLERANCE)


def graph_of(problem: Problem, programs: Programs) -> tuple[Graph, Order]:
    """The work graph of ``programs``' actions and their order in it."""
    graph = Graph(problem, [a for seq in programs for a in seq])
    return graph, tuple(graph.ids(seq) for seq in programs)


def programs_of(graph: Graph, order: Order) -> Programs:
    return tuple(tuple(graph.actions[a] for a in seq) for seq in order)


def choice_stages(problem: Problem) -> frozenset[int]:
    """The stages where keeping B whole or splitting it changes the work (B differs from I + W)."""
    cost = problem.costs.duration
    return frozenset(s for s in range(problem.stages) if abs(cost(B, s) - cost(I, s) - cost(W, s)) > TOLERANCE)


def fused_everywhere(programs: Programs, stages: frozenset[int]) -> Programs:
    """Every split pair of ``stages`` fused at its I's position (the seed with the least compute)."""
    return tuple(tuple(a._replace(kind=B) if a.kind is I and a.stage in stages else a for a in seq
                       if not (a.stage in stages and a.kind is W)) if stages else seq for seq in programs)


def split_everywhere(programs: Programs, stages: frozenset[int]) -> Programs:
    """Every B of ``stages`` split into its I and, right after it, its W."""
    return tuple(tuple(part for a in seq
                       for part in ((a._replace(kind=I), a._replace(kind=W)) if a.kind is B and a.stage in stages
                                    else (a,)))
                 for seq in programs)


def moves(programs: Programs, stages: frozenset[int], idle: frozenset[Action] = frozenset()) -> Iterator[Programs]:
    """Every fuse (at the I, at the W) and split of one (stage, microbatch) of ``stages``
    (``moves_of`` each of its I and B)."""
    for r, seq in enumerate(programs):
        for p, action in enumerate(seq):
            if action.stage in stages:
                yield from moves_of(programs, r, p, idle)


def moves_of(programs: Programs, r: int, p: int, idle: frozenset[Action]) -> Iterator[Programs]:
    """The moves of the action at position ``p`` of rank ``r``: an I fused with its W (at the I, at
    the W); a B split, its W right after the I, before each later action in ``idle`` (one its rank
    waits for: a gap the W may fill) and at the end of the rank; nothing for other kinds."""
    seq = programs[r]
    action = seq[p]
    if action.kind is I:
        w = seq.index(action._replace(kind=W))
        fused = action._replace(kind=B)
        yield _with(programs, r, seq[:p] + (fused,) + seq[p + 1:w] + seq[w + 1:])
        yield _with(programs, r, seq[:p] + seq[p + 1:w] + (fused,) + seq[w + 1:])
    elif action.kind is B:
        rest = seq[:p] + (action._replace(kind=I),) + seq[p + 1:]
        for q in dict.fromkeys([p + 1] + [q for q in range(p + 2, len(seq)) if seq[q] in idle] + [len(seq)]):
            yield _with(programs, r, rest[:q] + (action._replace(kind=W),) + rest[q:])


def _with(programs: Programs, r: int, seq: tuple[Action, ...]) -> Programs:
    return programs[:r] + (seq,) + programs[r + 1:]


def idle_actions(graph: Graph, order: Order) -> frozenset[Action]:
    """The actions whose rank is idle just before them (they wait for another rank)."""
    times = simulate_order(graph, order)
    return frozenset(graph.actions[seq[q]] for seq in order for q in range(1, len(seq))
                     if times.start[seq[q]] - times.end[seq[q - 1]] > TOLERANCE)


class FuseSearch:
    """Fuse descents alternating with local search on the mixed actions, until neither improves."""

    def __init__(self, problem: Problem, deadline: float, target: float, progress: Progress | None = None):
        self.problem, self.deadline, self.target, self.progress = problem, deadline, target, progress
        self.fusable = fusable_stages(problem)
        self.stages = choice_stages(problem)  # what the moves touch
        self.limit = problem.memory_limit

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def judge(self, programs: Programs) -> tuple[Graph, Order, Evaluation] | None:
        graph, order = graph_of(self.problem, programs)
        evaluation = evaluate(graph, order)
        if evaluation is None or not evaluation.fits(self.limit):
            return None
        return graph, order, evaluation

    def descend(self, best: tuple[Graph, Order, Evaluation]) -> tuple[tuple[Graph, Order, Evaluation], bool]:
        """Sweeps over every (stage, microbatch) of a stage in ``choice_stages``, keeping the first of its moves
        that lowers the key, until a sweep keeps none; returns the best and whether anything changed."""
        improved, changed = True, False
        while improved and self.left() > 0 and not self.reached(best[2]):
            improved = False
            targets = [(r, a) for r, seq in enumerate(programs_of(best[0], best[1])) for a in seq
                       if a.stage in self.stages and a.kind in (I, B)]
            idle = idle_actions(best[0], best[1])
            for r, action in targets:
                if self.left() <= 0 or self.reached(best[2]):
                    break
                found = self.first_better(best, r, action, idle)
                if found is not None:
                    best, improved, changed = found, True, True
                    idle = idle_actions(best[0], best[1])
        return best, changed

    def first_better(self, best: tuple[Graph, Order, Evaluation], r: int, action: Action,
                     idle: frozenset[Action]) -> tuple[Graph, Order, Evaluation] | None:
        """The first move of ``action`` (still an I or a B on rank ``r``) that lowers the key, if any."""
        programs = programs_of(best[0], best[1])
        if action not in programs[r]:
            return None  # an earlier move of this sweep fused or split it
        for candidate in moves_of(programs, r, programs[r].index(action), idle):
            if self.left() <= 0:
                return None
            found = self.judge(candidate)
            if found is not None and found[2].key() < best[2].key():
                return found
        return None

    def reached(self, evaluation: Evaluation) -> bool:
        return evaluation.max_span <= self.target + TOLERANCE

    def run(self, seeds: list[tuple[Graph, Order]]) -> tuple[Graph, Order, Evaluation] | None:
        """The best order found from ``seeds`` (each also with its least work), or None: a descent from
        each start, the best first (the best start is often a local optimum of the split work that no
        single move leaves, while the input's least work is not)."""
        if not self.fusable:
            return None
        starts = []
        for graph, order in seeds:
            programs = programs_of(graph, order)
            least = split_everywhere(fused_everywhere(programs, self.fusable), self.stages - self.fusable)
            starts += [found for found in (self.judge(programs), self.judge(least)) if found is not None]
        if not starts:
            return None
        starts.sort(key=lambda found: found[2].key())
        best = starts[0]
        for start in starts:
            if self.left() <= 0 or self.reached(best[2]):
                break
            found = self.improve(start)
            if found[2].key() < best[2].key():
                best = found
        return best

    def improve(self, best: tuple[Graph, Order, Evaluation]) -> tuple[Graph, Order, Evaluation]:
        """Fuse descents alternating with local search from ``best``, until neither improves."""
        from pipeforge.optimizer.local import local_search

        while self.left() > 0 and not self.reached(best[2]):
            if self.progress is not None:
                self.progress(0.4, f"fuse search: best worst span {best[2].max_span:g}")
            best, changed = self.descend(best)
            if self.left() <= 0 or self.reached(best[2]):
                break
            local = local_search(best[0], best[1], time_limit=self.left(), target=self.target, kicks=5)
            if local.evaluation.key() < best[2].key():
                best = (best[0], local.order, local.evaluation)
            elif not changed:
                break
        return best


__all__ = ["FuseSearch", "choice_stages", "fusable_stages", "fused_everywhere", "moves", "moves_of",
           "split_everywhere"]
