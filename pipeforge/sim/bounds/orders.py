"""Lower bounds on orders of these actions (space 1 below; space 2 is ``work.py``).

Two spaces, both on a given placement and cost model:

1. **Orders of these actions** (``compute_bounds`` -> ``Bounds``): the
   schedule's compute actions are fixed (which F/B/I/W run on which rank; a B
   stays a B); only their order on each rank may change, timed as soon as
   possible, within the memory limit when one is given. ``simulate`` reports
   these as ``lower_bound`` (makespan) and ``bubble_lower_bound``: how far this
   order is from the best order of its own actions.
2. **Schedules of this work** (``work_bound`` -> ``WorkBound``): every
   (stage, microbatch) runs its forward and its backward, and a backward may be
   split into I and W (the Zero Bubble split); any order within a memory limit
   L (the declared limit, else the schedule's own peak). ``optimize`` searches
   this space and reports this bound; ``simulate`` reports the same number
   (``bounds.work``) for the same input: how far the schedule is from the best
   one that holds no more activations.

Makespan is measured from time 0, a rank's span from its own first action to
its last; the bubble rate is ``1 - mean(busy) / max(span)``. A makespan bound
and a span bound therefore differ in general; where a rank must start at 0 and
end last, they meet (below), so a schedule optimal for one is shown optimal
for the other (1F1B: makespan bound 33 and bubble bound 27.27% at P=4, M=8).

What is proved for space 1, for every order:

- **work**: a rank finishes no earlier than the sum of its durations.
- **critical path**: no earlier than the longest chain of data dependencies
  (one microbatch up through every stage and back, ``comm`` added on each
  cross-rank edge), computed on the work graph with unlimited ranks.
- **head and tail** (per rank r): r cannot start before ``head_r``, the
  earliest any of its actions could start; after r's last action finishes,
  at least ``tail_r`` (the shortest remaining dependency chain after any of
  r's actions) must still run. So makespan >= head_r + work_r + tail_r.
- **memory** (only with a limit L, in M_B; the Zero Bubble paper's ZB-H1/H2
  reasoning made exact): before ``first_backward_r``, the earliest time any
  B/I of rank r can start, r can run only forwards (W needs I), nothing is
  released, and each F adds one M_B, so at most floor(L) forwards run there:
  at most ``pre_r`` = the sum of the floor(L) longest F durations on r. Hence
  r finishes no earlier than ``first_backward_r + work_r - pre_r``. With
  F = I = W = 1 and L = P this gives the ZB-H1 makespan (P-1) + 3M exactly.
- **spans**: a rank's first action is a forward F(s,m), and any B/I(s',m') on
  the rank is at least ``loop`` after its own F(s',m') (up to the last stage
  and back); before then at most ``pre_r`` of forward work fits (all of r's
  forwards when memory is unlimited). So
  ``span_r >= work_r + max(0, min loop_r - pre_r)``. And when r holds stage 0
  of every chain it runs (so in any order that runs, its first action is an
  F(0,m), at time 0) and every action nothing depends on (so it ends last),
  ``span_r`` is the makespan: ``span_r >= makespan bound``. Without a memory
  limit the span bound is often 0 for long pipelines, which is honest:
  zero-bubble orders exist there (ZB-2p, ZB-V).

What is proved for space 2 is in ``work.py``; ``pipeforge.sim.bounds`` exports both.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from pipeforge._gc import gc_paused
from pipeforge.ir import ActionKind, CostModel, MemorySpec, Schedule
from pipeforge.semantics import bubble_rate
from pipeforge.sim.workgraph import WorkGraph, compile_schedule, topological_order

_F, _B, _I, _W = ActionKind.F, ActionKind.B, ActionKind.I, ActionKind.W
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
    with gc_paused():  # the per-node lists die with _bounds_from_graph's frame, before the collector runs
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
        if action.kind is _F:
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
                  _finite_or_none(loops[r]), _forward_room(forwards[r], memory.count_limit(memory.limit, schedule.stages)),
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
