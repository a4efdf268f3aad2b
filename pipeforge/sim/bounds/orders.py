"""Lower bounds on every order of these actions (space 1 of ``pipeforge.sim.bounds``).

``compute_bounds(schedule, costs, memory, busy=...)`` -> ``Bounds``: the makespan and bubble-rate bounds
over orders of the schedule's own compute actions on each rank (timed as soon as possible, within the
memory limit when there is one), with each rank's ``RankBound`` (work, head, tail, first backward, loop).
These are ``simulate``'s ``lower_bound`` and ``bubble_lower_bound``. The arguments (work, critical
path, head and tail, memory, spans) and why they hold: ``docs/bounds.md``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from pipeforge.ir import ActionKind, CostModel, MemorySpec, Schedule
from pipeforge.semantics import bubble_rate
from pipeforge.sim.workgraph import WorkGraph, compile_schedule, topological_order

_F, _B, _I, _W, _R = ActionKind.F, ActionKind.B, ActionKind.I, ActionKind.W, ActionKind.R
ORDERS_SPACE = "any order of these actions on each rank"


@dataclass(frozen=True)
class RankBound:
    rank: int
    work: float
    head: float
    tail: float
    first_backward: float | None
    loop: float | None
    forward_room: float
    whole: bool = False  # starts at 0 and ends last in any order that runs: its span is the makespan

    @property
    def finish(self) -> float:
        """The rank's last action ends no earlier than this."""
        start = self.head
        if self.first_backward is not None:
            start = max(start, self.first_backward - self.forward_room)
        return start + self.work

    @property
    def span(self) -> float:
        if self.loop is None:
            return self.work
        return self.work + max(0.0, self.loop - self.forward_room)

    def to_json(self) -> dict:
        return {"rank": self.rank, "work": self.work, "head": self.head, "tail": self.tail,
                "first_backward": self.first_backward, "loop": self.loop,
                "forward_room": self.forward_room, "finish": self.finish, "span": self.span,
                "spans_makespan": self.whole}


@dataclass(frozen=True)
class Bounds:
    critical_path: float
    memory_limit: float | None
    per_rank: tuple[RankBound, ...]
    mean_busy: float

    @property
    def work(self) -> float:
        return max((b.work for b in self.per_rank), default=0.0)

    @property
    def head_tail(self) -> float:
        return max((b.head + b.work + b.tail for b in self.per_rank), default=0.0)

    @property
    def memory(self) -> float:
        return max((b.finish + b.tail for b in self.per_rank), default=0.0)

    @property
    def makespan(self) -> float:
        return max(self.critical_path, self.head_tail, self.memory)

    @property
    def binding(self) -> str:
        """Which bound is the best (largest)."""
        candidates = {"critical_path": self.critical_path, "work": self.work,
                      "head_tail": self.head_tail, "memory": self.memory}
        if self.memory_limit is None:
            del candidates["memory"]
        best = max(candidates.values())
        return next(name for name in ("work", "critical_path", "head_tail", "memory")
                    if name in candidates and candidates[name] >= best - 1e-12)

    def span_of(self, rank: int) -> float:
        """Rank ``rank``'s span is at least this (the makespan bound where it spans the makespan)."""
        bound = self.per_rank[rank]
        return max(bound.span, self.makespan) if bound.whole else bound.span

    @property
    def max_span(self) -> float:
        return max((self.span_of(b.rank) for b in self.per_rank), default=0.0)

    @property
    def bubble_rate(self) -> float:
        return bubble_rate(self.mean_busy, self.max_span)

    def to_json(self) -> dict:
        return {"space": ORDERS_SPACE, "makespan": self.makespan, "bubble_rate": self.bubble_rate,
                "max_span": self.max_span, "binding": self.binding,
                "work": self.work, "critical_path": self.critical_path, "head_tail": self.head_tail,
                "memory": self.memory if self.memory_limit is not None else None,
                "memory_limit": self.memory_limit, "ranks": [b.to_json() for b in self.per_rank]}


def compute_bounds(schedule: Schedule, costs: CostModel, memory: MemorySpec, *, busy: list[float],
                   graph: WorkGraph | None = None) -> Bounds:
    """Bounds for ``schedule``'s actions; ``busy[r]`` is rank r's total compute time. ``graph``: the
    schedule's work graph if already compiled (``simulate`` keeps its own)."""
    if graph is None:
        graph, _ = compile_schedule(schedule, costs, memory)
    return _bounds_from_graph(schedule, graph, memory, busy)


def _bounds_from_graph(schedule: Schedule, graph: WorkGraph, memory: MemorySpec, busy: list[float]) -> Bounds:
    order = topological_order(graph)
    est, down = earliest_starts(graph, order), remaining_after(graph, order)
    duration = graph.duration
    critical = max((est[a] + duration[a] + down[a] for a in range(len(graph.actions))), default=0.0)
    per_rank = _rank_bounds(schedule, graph, est, down, memory, busy)
    mean_busy = sum(busy) / len(busy) if busy else 0.0
    return Bounds(critical, memory.limit, per_rank, mean_busy)


def earliest_starts(graph: WorkGraph, order: list[int]) -> list[float]:
    """Each node's earliest start with unlimited ranks (an absent producer counts as ready at 0)."""
    n, duration, deps = len(graph.actions), graph.duration, graph.deps
    est = [0.0] * n
    for a in order:
        start = 0.0
        for d, latency in deps[a]:
            if d < n:
                arrival = est[d] + duration[d] + latency
                if arrival > start:
                    start = arrival
        est[a] = start
    return est


def remaining_after(graph: WorkGraph, order: list[int]) -> list[float]:
    """Each node's longest chain of dependents that must still run after it ends (edge latency included)."""
    n, duration, deps = len(graph.actions), graph.duration, graph.deps
    down = [0.0] * n
    for a in reversed(order):
        for d, latency in deps[a]:
            if d < n:
                through = latency + duration[a] + down[a]
                if through > down[d]:
                    down[d] = through
    return down


def _rank_bounds(schedule: Schedule, graph: WorkGraph, est: list[float], down: list[float], memory: MemorySpec,
                 busy: list[float]) -> tuple[RankBound, ...]:
    heads = [math.inf] * schedule.ranks
    tails = [math.inf] * schedule.ranks
    first_backward = [math.inf] * schedule.ranks
    loops = [math.inf] * schedule.ranks
    forwards: list[list[float]] = [[] for _ in range(schedule.ranks)]
    index, rank = graph.index, graph.rank
    for a, action in enumerate(graph.actions):
        r = rank[a]
        if est[a] < heads[r]:
            heads[r] = est[a]
        if down[a] < tails[r]:
            tails[r] = down[a]
        if action.kind is _F or action.kind is _R:  # what a rank may run before its first backward
            forwards[r].append(graph.duration[a])
        elif action.kind.is_backward:
            if est[a] < first_backward[r]:
                first_backward[r] = est[a]
            own_forward = index.get((action.stage, _F, action.microbatch, action.chain))
            if own_forward is not None and rank[own_forward] == r:
                loops[r] = min(loops[r], est[a] - est[own_forward])
    whole = _whole_ranks(schedule, graph)
    return tuple(
        RankBound(r, busy[r], _finite(heads[r]), _finite(tails[r]), _finite_or_none(first_backward[r]),
                  _finite_or_none(loops[r]),
                  _forward_room(forwards[r], memory.count_limit(memory.limit, schedule.stages)),
                  r in whole)
        for r in range(schedule.ranks)
    )


def _whole_ranks(schedule: Schedule, graph: WorkGraph) -> set[int]:
    """Ranks whose span is the makespan in any order that runs: the rank holding every action nothing
    depends on (it ends last), if it also holds stage 0 of each chain it runs (it starts at 0)."""
    n = len(graph.actions)
    used = [False] * n
    for deps in graph.deps:
        for d, _ in deps:
            if d < n:
                used[d] = True
    last = {graph.rank[a] for a in range(n) if not used[a]}
    if len(last) != 1:
        return set()
    (rank,) = last
    chains = {a.chain for a, r in zip(graph.actions, graph.rank) if r == rank}
    return {rank} if all(schedule.rank_of(0, c) == rank for c in chains) else set()


def _forward_room(durations: list[float], limit: float | None) -> float:
    """The most forward work a rank can do before its first backward: floor(limit) forwards at most."""
    if limit is None:
        return sum(durations)
    count = max(0, math.floor(limit + 1e-9))
    return sum(sorted(durations, reverse=True)[:count])


def _finite(value: float) -> float:
    return 0.0 if value == math.inf else value


def _finite_or_none(value: float) -> float | None:
    return None if value == math.inf else value
