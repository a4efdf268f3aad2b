"""Longest dependency paths among one microbatch's actions, shared by the bounds on schedules of this work."""

from __future__ import annotations

from collections import Counter
from functools import cached_property

from pipeforge.ir import ActionKind
from pipeforge.sim.workgraph import WorkGraph, topological_order

_F, _B, _I, _W = ActionKind.F, ActionKind.B, ActionKind.I, ActionKind.W


class Paths:
    """Longest dependency paths among one microbatch's actions of each chain (data dependencies never
    cross microbatches or chains, and every microbatch of a chain has the same paths)."""

    def __init__(self, graph: WorkGraph):
        self.graph = graph
        actions = graph.actions
        stages, kinds, microbatches, chains = zip(*actions) if actions else ((), (), (), ())
        first: dict[int, int] = {}
        for chain, mb in set(zip(chains, microbatches)):
            if mb is not None and mb < first.get(chain, mb + 1):
                first[chain] = mb
        self.members = [a for a, (mb, chain) in enumerate(zip(microbatches, chains))
                        if mb is not None and mb == first[chain]]
        self.children: dict[int, list[tuple[int, float]]] = {a: [] for a in self.members}
        for a in self.members:
            for d, latency in graph.deps[a]:
                if d in self.children:  # not a phantom (an input no action makes)
                    self.children[d].append((a, latency))
        self.order = topological_order(graph, self.members)
        self.forwards = [0] * graph.shape.ranks
        for r, n in Counter(r for r, kind in zip(graph.rank, kinds) if kind is _F).items():
            self.forwards[r] = n

    @cached_property
    def least(self) -> dict[int, float]:
        """Each member's least duration in any schedule of the work (``least_durations``)."""
        return least_durations(self.graph, self.members)

    def from_start_of(self, source: int, duration=None) -> dict[int, float]:
        """Earliest start of every action reachable from ``source`` when ``source`` starts at 0
        (``duration``: each action's, by id; default the graph's)."""
        duration = self.graph.duration if duration is None else duration
        start = {source: 0.0}
        for a in self.order:
            if a not in start:
                continue
            for b, latency in self.children[a]:
                start[b] = max(start.get(b, float("-inf")), start[a] + duration[a] + latency)
        return start

    def heads(self, r: int, duration: dict[int, float]) -> dict[int, float]:
        """For each action after some action of rank r: the least time from the start of r's first
        action to its start (the longest path from any of r's actions, which starts no earlier)."""
        rank, head = self.graph.rank, dict[int, float]()
        for a in self.order:
            h = head.get(a, -1.0)
            if rank[a] == r and h < 0.0:
                h = head[a] = 0.0
            if h < 0.0:
                continue
            for b, latency in self.children[a]:
                if h + duration[a] + latency > head.get(b, -1.0):
                    head[b] = h + duration[a] + latency
        return head

    def tails(self, r: int, duration: dict[int, float]) -> dict[int, float]:
        """For each action before some action of rank r: the least time from its end to the end of r's
        last action (the longest path to any of r's actions, which ends no later)."""
        rank, tail = self.graph.rank, dict[int, float]()
        for a in reversed(self.order):
            t = 0.0 if rank[a] == r else -1.0
            for b, latency in self.children[a]:
                after = tail.get(b)
                if after is not None and latency + duration[b] + after > t:
                    t = latency + duration[b] + after
            if t >= 0.0:
                tail[a] = t
        return tail


def least_durations(graph: WorkGraph, nodes: list[int]) -> dict[int, float]:
    """The least duration of each of ``nodes`` in any schedule of the work: an I the cheaper of I and
    B (a fused B holds its I), a W what the cheaper of B and I + W leaves after that (at most W)."""
    cost, found = graph.costs.duration, {}
    for a in nodes:
        action, duration = graph.actions[a], graph.duration[a]
        if action.kind is _I:
            duration = min(duration, cost(_B, action.stage))
        elif action.kind is _W:
            fused = cost(_B, action.stage) - min(cost(_I, action.stage), cost(_B, action.stage))
            duration = max(0.0, min(duration, fused))
        found[a] = duration
    return found
