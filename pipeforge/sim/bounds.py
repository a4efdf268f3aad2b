"""Lower bounds on the makespan and on the bubble rate of any order of the same actions.

The actions (which F/B/I/W run on which rank, at what cost) are fixed; only
their order on each rank may change. What is proved, for every such order:

- **work**: a rank finishes no earlier than the sum of its durations.
- **critical path**: no earlier than the longest chain of data dependencies
  (one microbatch up through every stage and back, ``comm`` added on each
  cross-rank edge), computed on the dependency graph with unlimited ranks.
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

For the bubble rate (``1 - mean(busy) / max(span)``) the bound is on spans,
measured from each rank's own first action: that action is a forward F(s,m),
and any B/I(s',m') on the rank is at least ``loop`` after its own F(s',m')
(up to the last stage and back); before then at most ``pre_r`` of forward work
fits (all of r's forwards when memory is unlimited). So
``span_r >= work_r + max(0, min loop_r - pre_r)``. This bound holds only for
orders that keep the memory limit; without a limit it is often 0 for long
pipelines, which is honest: zero-bubble orders exist there (ZB-2p, ZB-V).
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass

from pipeforge.ir import ActionKind, CostModel, MemorySpec, Schedule
from pipeforge.sim.costs import duration_table

_F, _W = ActionKind.F, ActionKind.W


@dataclass(frozen=True)
class RankBound:
    rank: int
    work: float
    head: float
    tail: float
    first_backward: float | None
    loop: float | None
    forward_room: float

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
                "forward_room": self.forward_room, "finish": self.finish, "span": self.span}


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

    @property
    def bubble_rate(self) -> float:
        longest = max((b.span for b in self.per_rank), default=0.0)
        return 1.0 - self.mean_busy / longest if longest > 0 else 0.0

    def to_json(self) -> dict:
        return {"makespan": self.makespan, "bubble_rate": self.bubble_rate, "binding": self.binding,
                "work": self.work, "critical_path": self.critical_path, "head_tail": self.head_tail,
                "memory": self.memory if self.memory_limit is not None else None,
                "memory_limit": self.memory_limit, "ranks": [b.to_json() for b in self.per_rank]}


@dataclass(slots=True)
class _Node:
    rank: int
    duration: float
    est: float = 0.0  # earliest start with unlimited ranks
    down: float = 0.0  # longest chain that must still run after it ends


def compute_bounds(schedule: Schedule, costs: CostModel, memory: MemorySpec, *, busy: list[float]) -> Bounds:
    """Bounds for ``schedule``'s actions; ``busy[r]`` is rank r's total compute time."""
    from pipeforge._gc import gc_paused

    with gc_paused():  # the graph's nodes die with _bounds_from_graph's frame, before the collector runs
        return _bounds_from_graph(schedule, costs, memory, busy)


def _bounds_from_graph(schedule: Schedule, costs: CostModel, memory: MemorySpec, busy: list[float]) -> Bounds:
    nodes, by_stage = _dependency_nodes(schedule, costs)
    comm = min((costs.comm, *costs.links))  # the least latency of any edge: still a lower bound
    _earliest_starts(nodes, by_stage, schedule.stages, comm)
    _remaining_after(nodes, by_stage, schedule.stages, comm)
    critical = max((n.est + n.duration + n.down for n in nodes.values()), default=0.0)
    per_rank = _rank_bounds(schedule, nodes, memory, busy)
    mean_busy = sum(busy) / len(busy) if busy else 0.0
    return Bounds(critical, memory.limit, per_rank, mean_busy)


def _dependency_nodes(schedule: Schedule, costs: CostModel):
    """One node per compute action, keyed ("F"|"G"|"W", chain, stage, mb); G is B or I."""
    durations = duration_table(costs, schedule.stages)
    nodes: dict[tuple, _Node] = {}
    by_stage: dict[tuple[str, int], list[tuple]] = defaultdict(list)
    for rank, _, action in schedule.actions():
        if not action.is_compute:
            continue
        role = "F" if action.kind is _F else "W" if action.kind is _W else "G"
        key = (role, action.chain, action.stage, action.microbatch)
        if key in nodes:
            continue
        duration = durations.get((action.kind, action.stage))
        if duration is None:
            duration = costs.duration(action.kind, action.stage)
        nodes[key] = _Node(rank, duration)
        by_stage[role, action.stage].append(key)
    return nodes, by_stage


def _arrival(nodes: dict, key: tuple, rank: int, comm: float) -> float:
    node = nodes.get(key)
    if node is None:
        return 0.0
    return node.est + node.duration + (comm if node.rank != rank else 0.0)


def _earliest_starts(nodes, by_stage, stages: int, comm: float) -> None:
    for stage in range(stages):
        for key in by_stage.get(("F", stage), ()):
            _, c, s, m = key
            nodes[key].est = _arrival(nodes, ("F", c, s - 1, m), nodes[key].rank, comm)
    for stage in reversed(range(stages)):
        for key in by_stage.get(("G", stage), ()):
            _, c, s, m = key
            node = nodes[key]
            node.est = max(_arrival(nodes, ("F", c, s, m), node.rank, comm),
                           _arrival(nodes, ("G", c, s + 1, m), node.rank, comm))
    for stage in range(stages):
        for key in by_stage.get(("W", stage), ()):
            _, c, s, m = key
            nodes[key].est = _arrival(nodes, ("G", c, s, m), nodes[key].rank, comm)


def _through(nodes: dict, key: tuple, rank: int, comm: float) -> float:
    """Time from the end of a node on ``rank`` to the end of everything that follows through ``key``."""
    node = nodes.get(key)
    if node is None:
        return 0.0
    return (comm if node.rank != rank else 0.0) + node.duration + node.down


def _remaining_after(nodes, by_stage, stages: int, comm: float) -> None:
    for stage in range(stages):
        for key in by_stage.get(("G", stage), ()):
            _, c, s, m = key
            node = nodes[key]
            node.down = max(_through(nodes, ("W", c, s, m), node.rank, comm),
                            _through(nodes, ("G", c, s - 1, m), node.rank, comm) if s > 0 else 0.0)
    for stage in reversed(range(stages)):
        for key in by_stage.get(("F", stage), ()):
            _, c, s, m = key
            node = nodes[key]
            node.down = max(_through(nodes, ("G", c, s, m), node.rank, comm),
                            _through(nodes, ("F", c, s + 1, m), node.rank, comm))


def _rank_bounds(schedule: Schedule, nodes: dict, memory: MemorySpec, busy: list[float]) -> tuple[RankBound, ...]:
    heads = [math.inf] * schedule.ranks
    tails = [math.inf] * schedule.ranks
    first_backward = [math.inf] * schedule.ranks
    loops = [math.inf] * schedule.ranks
    forwards: list[list[float]] = [[] for _ in range(schedule.ranks)]
    for key, node in nodes.items():
        r = node.rank
        heads[r] = min(heads[r], node.est)
        tails[r] = min(tails[r], node.down)
        if key[0] == "F":
            forwards[r].append(node.duration)
        elif key[0] == "G":
            first_backward[r] = min(first_backward[r], node.est)
            own_forward = nodes.get(("F",) + key[1:])
            if own_forward is not None and own_forward.rank == r:
                loops[r] = min(loops[r], node.est - own_forward.est)
    return tuple(
        RankBound(r, busy[r], _finite(heads[r]), _finite(tails[r]), _finite_or_none(first_backward[r]),
                  _finite_or_none(loops[r]), _forward_room(forwards[r], memory.count_limit(memory.limit, schedule.stages)))
        for r in range(schedule.ranks)
    )


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
