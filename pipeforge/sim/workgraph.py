"""The one timing engine: compute actions compiled once into a work graph, timed as soon as possible.

``compile_schedule(schedule, costs, memory)`` -> ``(WorkGraph, Order)`` (its overlap steps kept) and
``compile_actions(shape, actions, costs, memory)`` -> ``WorkGraph``: every compute action a node with its
rank, duration, memory effect and dependencies (``semantics.needs``, each with the edge's latency).
``time_order(graph, order)`` -> ``Times``: each node started when its rank's previous node and its inputs
have ended, in time linear in the nodes; an input nothing produces never arrives. ``simulate`` and every
optimizer strategy time their orders here. How: ``docs/simulate.md`` (The engine).
"""

from __future__ import annotations

from typing import NamedTuple

from pipeforge.ir import COMPUTE_KINDS, Action, ActionKind, CostModel, MemorySpec, Placement, Schedule
from pipeforge.semantics import ActionKey, effects_of, lane, needs, needs_if_present, offload_waits, waited_offload
from pipeforge.sim.costs import duration_table

Order = tuple[tuple[int, ...], ...]
Dependency = tuple[int, float]  # (producer node, latency of the edge)


class WorkGraph:
    """Compute actions as nodes: rank, duration, memory effect, dependencies with latency."""

    def __init__(self, shape: Shape, actions: list[Action], costs: CostModel, memory: MemorySpec):
        self.shape, self.costs, self.memory, self.weights = shape, costs, memory, memory.weights
        self.actions = actions
        self.index: dict[ActionKey, int] = {}  # Actions, looked up by plain tuples equal to them too
        for node, action in enumerate(actions):
            self.index.setdefault(action, node)
        placements = shape.placements
        self.rank = [placements[a.chain].stage_to_rank[a.stage] for a in actions]
        self.duration = _durations(actions, costs, shape.stages)
        effect = effects_of(memory, actions)
        effects = [effect(a) for a in actions]
        self.added = [added for added, _ in effects]
        self.released = [released for _, released in effects]
        self.delta = [added - released for added, released in effects]
        self.phantoms: list[tuple[ActionKey, ...]] = []  # node len(actions) + k stands for phantoms[k]
        self.deps = self._dependencies(costs)
        self.waits = self.deps  # what the engine waits for (compile_schedule widens it for overlap steps)
        self.joins: list[bool] | None = None  # node issued together with the previous one of its rank
        # node on its rank's copy lane (OFFLOAD, RELOAD: semantics.LANES), None when there is none
        copy = [lane(a.kind) == "copy" for a in actions]
        self.copy: list[bool] | None = copy if any(copy) else None
        self.step: list[int] | None = None  # node -> its step's index in the rank's program as written

    @property
    def size(self) -> int:
        """Nodes, phantoms included."""
        return len(self.actions) + len(self.phantoms)

    def _dependencies(self, costs: CostModel) -> list[tuple[Dependency, ...]]:
        """Each node's producers with the edge's latency: 0 on one rank, else ``CostModel.latency``
        of the two stages (``comm``, or its link's own where ``links`` gives one)."""
        index, rank, stages = self.index, self.rank, self.shape.stages
        comm, links = costs.comm, bool(costs.links)
        phantom_ids: dict[tuple[ActionKey, ...], int] = {}
        found = []
        for node, action in enumerate(self.actions):
            here, deps = rank[node], []
            for producers, _, _ in needs(action, stages):
                producer = _first_present(index, producers)
                if producer is None:
                    producer = phantom_ids.get(producers)
                    if producer is None:
                        producer = phantom_ids[producers] = len(self.actions) + len(self.phantoms)
                        self.phantoms.append(producers)
                    deps.append((producer, 0.0))
                elif rank[producer] == here:
                    deps.append((producer, 0.0))
                else:
                    latency = costs.latency(self.actions[producer].stage, action.stage) if links else comm
                    deps.append((producer, latency))
            for key in needs_if_present(action):  # after the R or RELOAD of its activations, when there is one
                producer = index.get(key)
                if producer is not None:
                    deps.append((producer, 0.0))
            found.append(tuple(deps))
        return found

    def ids(self, actions) -> tuple[int, ...]:
        """The nodes of ``actions`` (Actions, or plain tuples laid out like them)."""
        index = self.index
        return tuple(index[a] for a in actions)

    def order_of(self, schedule: Schedule) -> Order:
        """The schedule's compute actions as an order (overlap steps flattened)."""
        index = self.index
        return tuple(tuple(index[a] for step in program if step.is_compute for a in step.actions)
                     for program in schedule.programs)


class Shape(NamedTuple):
    """What every order of a work graph shares: ranks, stages, microbatches and placements."""

    ranks: int
    stages: int
    microbatches: int
    placements: tuple[Placement, ...]

    @staticmethod
    def of(schedule: Schedule) -> Shape:
        return Shape(schedule.ranks, schedule.stages, schedule.microbatches, schedule.placements)


def _first_present(index: dict[ActionKey, int], producers: tuple[ActionKey, ...]) -> int | None:
    for producer in producers:
        node = index.get(producer)
        if node is not None:
            return node
    return None


def _durations(actions: list[Action], costs: CostModel, stages: int) -> list[float]:
    table = duration_table(costs, stages)
    found = []
    for a in actions:
        duration = table.get((a.kind, a.stage))
        found.append(duration if duration is not None else costs.duration(a.kind, a.stage))
    return found


def compile_schedule(schedule: Schedule, costs: CostModel, memory: MemorySpec) -> tuple[WorkGraph, Order]:
    """A schedule's compute steps as a work graph (one node per compute action as written, in program
    order) and its order; overlap steps are kept (see the module doc)."""
    actions: list[Action] = []
    steps: list[int] = []
    joins: list[bool] = []
    order = []
    for program in schedule.programs:
        nodes = []
        for index, step in enumerate(program):
            if not step.actions or step.actions[0].kind not in COMPUTE_KINDS:
                continue
            for position, action in enumerate(step.actions):
                nodes.append(len(actions))
                actions.append(action)
                steps.append(index)
                joins.append(position > 0)
        order.append(tuple(nodes))
    graph = WorkGraph(Shape.of(schedule), actions, costs, memory)
    graph.step = steps
    if any(joins):
        graph.joins = joins
        graph.waits = _overlap_waits(graph.deps, joins)
    if graph.copy is not None:
        graph.waits = _offload_waits(graph, tuple(order))
    return graph, tuple(order)


def _offload_waits(graph: WorkGraph, order: Order) -> list[tuple[Dependency, ...]]:
    """A step that adds memory (F, R, RELOAD) waits, at its first node, for the end of the OFFLOAD
    ``semantics.offload_waits`` names for it, if any (of an overlap step, ``semantics.waited_offload``):
    only where, counting each earlier offload's release from its transfer's end, what it adds would pass
    the memory limit (none declared: it never waits; docs/semantics.md, "Recompute and offload")."""
    waits = list(graph.waits)
    offload, added, released, actions = ActionKind.OFFLOAD, graph.added, graph.released, graph.actions
    steps = graph.step
    limit = graph.memory.limit
    if limit is None:
        return waits
    for seq in order:
        groups: list[list[int]] = []  # the rank's nodes, one list a step
        for node in seq:
            if groups and steps is not None and steps[node] == steps[groups[-1][0]]:
                groups[-1].append(node)
            else:
                groups.append([node])
        summary = [(sum(added[n] for n in group), sum(released[n] for n in group),
                    any(actions[n].kind is offload for n in group)) for group in groups]
        for group, wait in zip(groups, offload_waits(summary, limit)):
            if wait is not None:  # the step's additions count from its start (an overlap step's first node)
                waited = groups[wait]
                offload_node = waited[waited_offload([actions[n].kind for n in waited])]
                waits[group[0]] = waits[group[0]] + ((offload_node, 0.0),)
    return waits


def _overlap_waits(deps: list[tuple[Dependency, ...]], joins: list[bool]) -> list[tuple[Dependency, ...]]:
    """The first node of each overlap step waits for what every node of the step needs."""
    waits = list(deps)
    leader = 0
    for node, joined in enumerate(joins):
        if joined:
            waits[leader] = waits[leader] + deps[node]
        else:
            leader = node
    return waits


def compile_actions(shape: Shape, actions, costs: CostModel, memory: MemorySpec) -> WorkGraph:
    """A work graph of a set of compute actions, whatever their order: what the optimizers reorder."""
    return WorkGraph(shape, canonical(actions), costs, memory)


def canonical(actions) -> list[Action]:
    """Distinct actions in id order: by chain, stage, kind, microbatch."""
    return sorted(set(actions), key=lambda a: (a.chain, a.stage, a.kind, -1 if a.microbatch is None else a.microbatch))


# --- the engine ----------------------------------------------------------------------------


class Times(NamedTuple):
    """Start and end of every node (-1 for a node that never ran) and how far each rank got."""

    start: list[float]
    end: list[float]
    done: list[int]  # per rank: how many nodes of its order ran

    def finished(self, order: Order) -> bool:
        return all(d == len(seq) for d, seq in zip(self.done, order))


def time_order(graph: WorkGraph, order: Order, resume: tuple[Times, list[int]] | None = None) -> Times:
    """As-soon-as-possible times of ``order`` (see the module doc); ranks that wait forever stop.

    ``resume = (times, kept)`` starts from an earlier run: on each rank r the
    first ``kept[r]`` nodes are the same as then and keep their times. That is
    sound when the kept nodes are closed under dependencies and rank order,
    e.g. every node that started before some time t (nothing depends on what
    starts later, since durations are positive).
    """
    if graph.copy is not None:
        return _time_with_copies(graph, order)
    size = graph.size
    start, end = [0.0] * size, [-1.0] * size
    done, free = [0] * len(order), [0.0] * len(order)
    if resume is not None:
        _resume(order, resume, start, end, done, free)
    waits, duration = graph.waits, graph.duration
    waiting: dict[int, list[int]] = {}
    ready = list(range(len(order)))
    while ready:
        r = ready.pop()
        seq, p, t = order[r], done[r], free[r]
        count = len(seq)
        while p < count:
            a = seq[p]
            s = t
            for d, latency in waits[a]:
                e = end[d]
                if e < 0.0:
                    waiting.setdefault(d, []).append(r)
                    break
                e += latency
                if e > s:
                    s = e
            else:
                start[a] = s
                t = s + duration[a]
                end[a] = t
                p += 1
                woken = waiting.pop(a, None)
                if woken is not None:
                    ready.extend(woken)
                continue
            break
        done[r], free[r] = p, t
    return Times(start, end, done)


def _time_with_copies(graph: WorkGraph, order: Order) -> Times:
    """``time_order`` for a graph with copy-lane nodes: a rank issues its nodes in order; a compute node
    runs on the compute lane as usual, a copy node (OFFLOAD, RELOAD) on the rank's copy lane, from when
    the rank issues it (the compute before it has ended), the lane is free and its inputs have ended;
    the compute lane does not wait for it."""
    size = graph.size
    start, end = [0.0] * size, [-1.0] * size
    done, free, lane_free = [0] * len(order), [0.0] * len(order), [0.0] * len(order)
    waits, duration, copy = graph.waits, graph.duration, graph.copy
    assert copy is not None, "time_order sends here only a graph with copy-lane nodes"
    waiting: dict[int, list[int]] = {}
    ready = list(range(len(order)))
    while ready:
        r = ready.pop()
        seq, p, t = order[r], done[r], free[r]
        count = len(seq)
        while p < count:
            a = seq[p]
            on_copy = copy[a]
            s = max(t, lane_free[r]) if on_copy else t
            for d, latency in waits[a]:
                e = end[d]
                if e < 0.0:
                    waiting.setdefault(d, []).append(r)
                    break
                e += latency
                if e > s:
                    s = e
            else:
                start[a] = s
                end[a] = s + duration[a]
                if on_copy:
                    lane_free[r] = end[a]
                else:
                    t = end[a]
                p += 1
                woken = waiting.pop(a, None)
                if woken is not None:
                    ready.extend(woken)
                continue
            break
        done[r], free[r] = p, t
    return Times(start, end, done)


def _resume(order: Order, resume: tuple[Times, list[int]], start: list[float], end: list[float],
            done: list[int], free: list[float]) -> None:
    times, kept = resume
    for r, seq in enumerate(order):
        for a in seq[: kept[r]]:
            start[a], end[a] = times.start[a], times.end[a]
        done[r] = kept[r]
        free[r] = times.end[seq[kept[r] - 1]] if kept[r] else 0.0


def topological_order(graph: WorkGraph, nodes: list[int] | None = None) -> list[int]:
    """``nodes`` (default: every real node), each after those of them it depends on; a dependency outside
    ``nodes`` (or a phantom) is not waited for. Data dependencies never form a cycle."""
    n, deps = len(graph.actions), graph.deps
    chosen = range(n) if nodes is None else nodes
    inside = None if nodes is None else set(nodes)
    waiting_on = [0] * n
    users: list[list[int]] = [[] for _ in range(n)]
    for a in chosen:
        for d, _ in deps[a]:
            if d < n and (inside is None or d in inside):
                users[d].append(a)
                waiting_on[a] += 1
    found = [a for a in chosen if not waiting_on[a]]
    for a in found:  # the list grows while it is read
        for user in users[a]:
            waiting_on[user] -= 1
            if not waiting_on[user]:
                found.append(user)
    return found


def blocking_input(graph: WorkGraph, times: Times, node: int) -> int:
    """What ``node`` (where its rank stopped) waits for: the first of its waits that never ended."""
    return next(d for d, _ in graph.waits[node] if times.end[d] < 0.0)


def peak_memory(graph: WorkGraph, sequence: tuple[int, ...]) -> float:
    """The most a rank holds after the additions of any step, in its order (units of M_B)."""
    joins = graph.joins
    held = peak = 0.0
    if joins is None:
        delta = graph.delta
        for a in sequence:
            held += delta[a]
            if held > peak:
                peak = held
        return peak
    added, released, pending = graph.added, graph.released, 0.0
    for a in sequence:
        if not joins[a]:
            held -= pending
            pending = 0.0
        held += added[a]
        pending += released[a]
        if held > peak:
            peak = held
    return peak
