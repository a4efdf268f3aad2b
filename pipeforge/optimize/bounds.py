"""Proven lower bounds on the worst span (and so on the bubble rate) of any order.

The search space is every compute order of the problem's (stage, microbatch)
pairs with the backward split into I and W (a B is an I followed at once by
its W, so it is covered when B = I + W), for any placement, under the memory
limit. Two bounds, per rank; the worst rank's is the bound:

- ``busy``: a rank's span is at least the sum of its compute durations.
- ``round trip`` (any placement): a rank's first action is an F of the lowest
  stage it holds (every other action of the rank needs one before it on the
  rank). No I of a stage s on the rank can start before one *round trip*
  after that first start: the longest dependency path from that F to I(s)
  (the F down to the loss and the I back, with ``comm`` on every cross-rank
  hop). Before the earliest of them the rank can run only F, at most
  ``floor(limit)`` (nothing is released before an I), each no longer than its
  longest F: the rest of that window is idle (*head*). After the rank's last
  F, the I of that microbatch and stage waits its own round trip (less the
  F); meanwhile the rank can run only the I and W of what it still holds,
  capped by the limit: ``k`` with I pending and ``j`` with only W pending need
  ``k + weights * j <= limit`` (*tail*). When the rank cannot run every F
  before its first I, the two idle windows are disjoint and add up.

For one stage a rank in loop order this is the bound of the Zero Bubble
setting: at p=8, m=24, memory limit 8, the paper's costs, the round-trip bound
on rank 0 equals the span of ZB-1p, so that schedule is optimal there.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from pipeforge.ir import ActionKind
from pipeforge.optimize.evaluate import TOLERANCE, Graph, Problem

F, B, I, W = ActionKind.F, ActionKind.B, ActionKind.I, ActionKind.W


def busy_per_rank(graph: Graph) -> list[float]:
    """Each rank's least compute time: F and the cheaper of B or I + W, for each forward it runs."""
    problem, cost = graph.problem, graph.problem.costs.duration
    per_stage = [cost(F, s) + min(cost(B, s), cost(I, s) + cost(W, s)) for s in range(problem.stages)]
    busy = [0.0] * problem.ranks
    for action, rank in zip(graph.actions, graph.rank):
        if action.kind is F:
            busy[rank] += per_stage[action.stage]
    return busy


@dataclass(frozen=True)
class _RankShape:
    """What the round-trip bound needs of one rank (read from microbatch 0: costs do not depend on it)."""

    trip_to_i: float      # from the start of the rank's first F to the earliest start of any of its I
    least_lag: float      # the least wait, over its stages, from the end of an F to the start of its I
    forwards: int         # how many F the rank runs in all
    longest_f: float
    longest_iw: float     # the longest I + W among its stages
    longest_w: float


class _Paths:
    """Longest dependency paths among one microbatch's actions (data dependencies never cross microbatches)."""

    def __init__(self, graph: Graph, mb: int):
        self.graph = graph
        self.members = [a for a, action in enumerate(graph.actions) if action.microbatch == mb]
        self.children: dict[int, list[tuple[int, float]]] = {a: [] for a in self.members}
        for a in self.members:
            for d, latency in graph.deps[a]:
                self.children[d].append((a, latency))
        self.order = self._topological()
        self.forwards = [0] * graph.problem.ranks
        for a, action in enumerate(graph.actions):
            if action.kind is F:
                self.forwards[graph.rank[a]] += 1

    def _topological(self) -> list[int]:
        indegree = {a: len(self.graph.deps[a]) for a in self.members}
        ready = [a for a, n in indegree.items() if n == 0]
        out = []
        while ready:
            a = ready.pop()
            out.append(a)
            for b, _ in self.children[a]:
                indegree[b] -= 1
                if indegree[b] == 0:
                    ready.append(b)
        return out

    def from_start_of(self, source: int) -> dict[int, float]:
        """Earliest start of every action reachable from ``source`` when ``source`` starts at 0."""
        start = {source: 0.0}
        for a in self.order:
            if a not in start:
                continue
            for b, latency in self.children[a]:
                start[b] = max(start.get(b, float("-inf")), start[a] + self.graph.duration[a] + latency)
        return start


def _rank_shape(graph: Graph, paths: _Paths, r: int) -> _RankShape | None:
    """Rank r's round trips (None when it runs no F or no I of the microbatch)."""
    actions, duration = graph.actions, graph.duration
    mine = {k: [a for a in paths.members if graph.rank[a] == r and actions[a].kind is k] for k in (F, I, W)}
    if not mine[F] or not mine[I]:
        return None
    lane = {(actions[a].chain, actions[a].stage, actions[a].kind): a for k in (F, I, W) for a in mine[k]}
    first = min(mine[F], key=lambda a: (actions[a].chain, actions[a].stage))
    from_first = paths.from_start_of(first)
    trips = [from_first[a] for a in mine[I] if a in from_first]
    lags, iw, w = [], [], []
    for f in mine[F]:
        c, stage = actions[f].chain, actions[f].stage
        i, wa = lane.get((c, stage, I)), lane.get((c, stage, W))
        if i is not None:
            lags.append(paths.from_start_of(f)[i] - duration[f])
            iw.append(duration[i] + (duration[wa] if wa is not None else 0.0))
        w.append(duration[wa] if wa is not None else 0.0)
    if not trips or not lags:
        return None
    return _RankShape(min(trips), min(lags), paths.forwards[r], max(duration[a] for a in mine[F]), max(iw), max(w))


def tail_work(shape: _RankShape, limit: float, weights: float) -> float:
    """The most I/W work a rank can hold ready for after its last F (memory-capped)."""
    best = 0.0
    for k in range(1, min(shape.forwards, math.floor(limit + TOLERANCE)) + 1):
        room = limit - k
        j = shape.forwards - k if weights <= 0 else min(shape.forwards - k, math.floor(room / weights + TOLERANCE))
        best = max(best, (k - 1) * shape.longest_iw + j * shape.longest_w)
    return best


def round_trip_idle(graph: Graph, r: int, paths: _Paths | None = None) -> float:
    """Idle time rank r cannot avoid inside its span (0 when nothing can be said)."""
    problem = graph.problem
    shape = _rank_shape(graph, paths or _Paths(graph, 0), r)
    if shape is None:
        return 0.0
    limit = problem.memory.count_limit(problem.memory_limit, problem.stages) if problem.memory_limit is not None \
        else float(shape.forwards)
    first_burst = min(shape.forwards, math.floor(limit + TOLERANCE))
    head = max(0.0, shape.trip_to_i - first_burst * shape.longest_f)
    tail = max(0.0, shape.least_lag - tail_work(shape, limit, problem.memory.least_weights(problem.stages)))
    if first_burst < shape.forwards:
        return head + tail
    return max(head, tail)


def span_lower_bound(graph: Graph) -> float:
    """A proven lower bound on the worst span of any valid order of ``graph``'s forwards."""
    busy, paths = busy_per_rank(graph), _Paths(graph, 0)
    return max(busy[r] + round_trip_idle(graph, r, paths) for r in range(graph.problem.ranks))


def bubble_of_span(graph: Graph, span: float) -> float:
    """The bubble rate a worst span of ``span`` gives (busy time does not depend on the order)."""
    busy = busy_per_rank(graph)
    return 1.0 - (sum(busy) / len(busy)) / span if span > 0 else 0.0


def bubble_lower_bound(graph: Graph) -> float:
    return bubble_of_span(graph, span_lower_bound(graph))
