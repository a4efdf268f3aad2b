"""Event simulation of a schedule's compute on a cost model.

``simulate(schedule, costs, memory=...)`` -> ``Timeline``: each rank's compute steps in program order,
each started as soon as its rank is free and its inputs (``semantics.needs``) have arrived, timed by the
one engine of ``sim/workgraph.py``; per rank busy time, span, peak memory and events; the makespan and
the Zero Bubble paper's bubble rate. Communication, REDUCE_GRAD and idle steps take no time. An order
whose ranks wait for inputs that never come raises ``VerificationError`` naming every stuck rank, its
step and what it waits for. What is modelled, precisely (overlap steps, memory): ``docs/simulate.md``.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import NamedTuple

from pipeforge.errors import VerificationError
from pipeforge.ir import Action, ActionKind, CostModel, MemorySpec, Schedule, Step, as_action
from pipeforge.semantics import (PARAMETER_MEMORY, SAVING, bubble_rate, effects_of, held_after_additions, split,
                                 within_limit)
from pipeforge.sim.bounds import bubble_of_span, compute_bounds, with_forced_recompute, work_bound
from pipeforge.sim.costs import costs_to_json, resolve_costs
from pipeforge.sim.workgraph import (Order, Shape, Times, WorkGraph, blocking_input, compile_actions, compile_schedule,
                                    peak_memory, time_order)



class Event(NamedTuple):
    """One compute step as it ran: ``actions`` back to back from ``start`` to ``end``.

    ``step`` is the index in the rank's program as written (idle slots and
    communication counted), as in verify's reports. ``durations`` holds each
    action's share, in the order of ``actions``. (A NamedTuple: immutable, and
    cheap to make a hundred thousand of.)
    """

    rank: int
    step: int
    actions: tuple[Action, ...]
    start: float
    end: float
    durations: tuple[float, ...] = ()
    lane: str = "compute"  # or "copy": OFFLOAD and RELOAD, beside the rank's compute (semantics.LANES)

    @property
    def duration(self) -> float:
        return self.end - self.start

    def action_spans(self) -> tuple[tuple[Action, float, float], ...]:
        """``(action, start, end)`` of each action inside the step."""
        spans, t = [], self.start
        durations = self.durations or (self.duration / len(self.actions),) * len(self.actions)
        for action, length in zip(self.actions, durations):
            spans.append((action, t, t + length))
            t += length
        return tuple(spans)

    @property
    def label(self) -> str:
        return ";".join(map(str, self.actions))


@dataclass(frozen=True)
class RankStats:
    rank: int
    busy: float
    start: float
    end: float
    peak_memory: float
    actions: int

    @property
    def span(self) -> float:
        return self.end - self.start

    @property
    def bubble_rate(self) -> float:
        return 1.0 - self.busy / self.span if self.span > 0 else 0.0

    def to_json(self) -> dict:
        return {
            "rank": self.rank, "busy": self.busy, "span": self.span, "start": self.start, "end": self.end,
            "bubble_rate": self.bubble_rate, "peak_memory": self.peak_memory, "actions": self.actions,
        }


@dataclass(frozen=True)
class Timeline:
    """When every compute step ran, and the figures of merit that follow."""

    name: str
    ranks: int
    stages: int
    microbatches: int
    events: tuple[Event, ...]
    costs: CostModel
    memory: MemorySpec
    rank_stats: tuple[RankStats, ...]
    schedule: Schedule = field(repr=False, compare=False)
    graph: WorkGraph | None = field(default=None, repr=False, compare=False)  # the schedule compiled (for bounds)

    @cached_property
    def bounds(self):
        """Lower bounds (pipeforge.sim.bounds.Bounds), computed on first use.

        The memory bound is left out when this schedule itself breaks the limit.
        """
        memory = self.memory
        if self.within_memory_limit is False or self.saves_memory:
            # the memory bound speaks only of orders within the limit, and reasons that an F holds its
            # activation until its backward: a schedule that recomputes or offloads holds less
            memory = replace(memory, limit=None)
        return compute_bounds(self.schedule, self.costs, memory, busy=[s.busy for s in self.rank_stats],
                              graph=self.graph)

    @cached_property
    def split_work(self):
        """This schedule's work with every B split into I and W (a ``WorkGraph``), as optimize searches it."""
        actions = [part for _, _, a in self.schedule.actions() if a.is_compute and a.kind not in SAVING
                   for part in split(a)]  # the work: F and the backward (R, OFFLOAD, RELOAD are a choice)
        return compile_actions(Shape.of(self.schedule), actions, self.costs, self.memory)

    @cached_property
    def work_bound(self):
        """The bound on every schedule of this work (``pipeforge.sim.bounds.WorkBound``, space 2 there)
        within the memory limit, else within this schedule's own peak: what ``optimize`` reports."""
        bound = work_bound(self.split_work, self.work_limit)
        # the recompute its limit forces (where this schedule itself keeps the limit, as for the memory bound)
        if self.recomputes_only and self.memory.limit is not None and self.within_memory_limit is not False:
            bound = with_forced_recompute(bound, self.split_work, self.memory)
        return bound

    @property
    def work_bubble_rate(self) -> float:
        """This schedule's bubble rate counted on the least work the work bound counts (each rank's F and
        the cheaper of B or I + W, ``bounds.busy_per_rank``) rather than on its own busy time: where B and
        I + W differ the two differ, and only this one is comparable with ``work_bound.bubble_rate`` (never
        below it, as the worst span is never below the bound's); optimize reports the same rate."""
        return bubble_of_span(self.split_work, max((s.span for s in self.rank_stats), default=0.0))

    @property
    def work_limit(self) -> float | None:
        """The memory limit of the work bound: the declared one, else this schedule's peak; none where the
        schedule recomputes or offloads (a schedule of this work may then hold less than its F's
        activations, which the bound's memory arguments count)."""
        if self.saves_memory:
            return None
        return self.memory.limit if self.memory.limit is not None else max(self.peak_memory, default=0.0)

    @property
    def recomputes_only(self) -> bool:
        """The schedule recomputes some microbatch and offloads none (what ``with_forced_recompute`` covers)."""
        return self.saves_memory and not any(a.kind is ActionKind.OFFLOAD for _, _, a in self.schedule.actions())

    @cached_property
    def saves_memory(self) -> bool:
        """The schedule recomputes or offloads some microbatch (R, OFFLOAD, RELOAD)."""
        return any(a.kind in SAVING for _, _, a in self.schedule.actions())

    @property
    def makespan(self) -> float:
        return max((s.end for s in self.rank_stats if s.actions), default=0.0)

    @property
    def step_time(self) -> float:
        """A training step: the makespan plus what the costs say a step costs beyond its actions
        (``CostModel.overhead``: the runtime's own work, a bidirectional schedule's gradient sum)."""
        return self.makespan + self.costs.overhead.of(self.schedule)

    @property
    def bubble_rate(self) -> float:
        """The Zero Bubble paper's: ``1 - mean(busy) / max(span)`` over ranks."""
        return bubble_rate_of([s.busy for s in self.rank_stats], [s.span for s in self.rank_stats])

    @property
    def peak_memory(self) -> tuple[float, ...]:
        return tuple(s.peak_memory for s in self.rank_stats)

    @property
    def lower_bound(self) -> float:
        return self.bounds.makespan

    @property
    def bubble_lower_bound(self) -> float:
        return self.bounds.bubble_rate

    @property
    def gap(self) -> float:
        """How far the makespan is above the best lower bound, as a fraction of the bound."""
        return self.makespan / self.lower_bound - 1.0 if self.lower_bound > 0 else 0.0

    @property
    def within_memory_limit(self) -> bool | None:
        if self.memory.limit is None:
            return None
        return all(within_limit(peak, self.memory.limit) for peak in self.peak_memory)

    @cached_property
    def events_by_rank(self) -> tuple[tuple[Event, ...], ...]:
        by_rank: list[list[Event]] = [[] for _ in range(self.ranks)]
        for event in self.events:
            by_rank[event.rank].append(event)
        return tuple(tuple(events) for events in by_rank)

    def events_on(self, rank: int) -> tuple[Event, ...]:
        """Rank ``rank``'s events in program order."""
        return self.events_by_rank[rank]

    @cached_property
    def memory_curves(self) -> tuple[tuple[tuple[float, float], ...], ...]:
        """Per rank, what it holds over time (M_B): ``(time, held from then on)`` where it changes, from
        ``(0, 0)``. Each action's effect (``semantics.effects_of``, as the peak counts it) adds at its start and
        releases at its end; at one time the releases come first (UNSHARD and RESHARD, which take no time,
        are left out of it). Its largest value is ``timed_peak_memory``."""
        effect = effects_of(self.memory, (a for _, _, a in self.schedule.actions()))
        curves = []
        for events in self.events_by_rank:
            changes: list[tuple[float, int, float]] = []  # (time, 0 release / 1 addition, amount)
            for event in events:
                for action, start, end in event.action_spans():
                    added, released = effect(action)
                    if added:
                        changes.append((start, 1, added))
                    if released:
                        changes.append((end, 0, -released))
            held, at = 0.0, [(0.0, 0.0)]
            for time, _, amount in sorted(changes, key=lambda c: (c[0], c[1])):
                held += amount
                at[-1:] = [(time, held)] if at[-1][0] == time else [at[-1], (time, held)]
            curve = [at[0]] + [point for before, point in zip(at, at[1:]) if point[1] != before[1]]
            curves.append(tuple(curve))
        return tuple(curves)

    @property
    def timed_peak_memory(self) -> tuple[float, ...]:
        """Per rank, the most it holds at any time of this timing (``memory_curves``: an OFFLOAD's release
        counted from its transfer's end). Under a declared limit that ``peak_memory`` keeps, never above it
        (the copy lane rule, docs/semantics.md); without one it may pass ``peak_memory``, where an addition
        did not wait for a transfer still in flight."""
        return tuple(max(held for _, held in curve) for curve in self.memory_curves)

    def to_json(self) -> dict:
        return {
            "schedule": self.name,
            "makespan": self.makespan,
            "step_time": self.step_time,
            "bubble_rate": self.bubble_rate,
            "least_work_bubble_rate": self.work_bubble_rate,
            "peak_memory": list(self.peak_memory),
            "timed_peak_memory": list(self.timed_peak_memory),
            "lower_bound": self.lower_bound,
            "bubble_lower_bound": self.bubble_lower_bound,
            "gap": self.gap,
            "bounds": {**self.bounds.to_json(), "work": self.work_bound.to_json()},
            "costs": costs_to_json(self.costs),
            "memory": {"limit": self.memory.limit, "weights": self.memory.weights,
                       "within_limit": self.within_memory_limit},
            "ranks": [s.to_json() for s in self.rank_stats],
        }


def bubble_rate_of(busy: list[float], spans: list[float]) -> float:
    """The bubble rate of ranks busy ``busy`` over spans ``spans`` (``semantics.bubble_rate``)."""
    return bubble_rate(sum(busy) / len(busy) if busy else 0.0, max(spans, default=0.0))


def simulate(schedule: Schedule, costs: CostModel | None = None, *, memory: MemorySpec | None = None) -> Timeline:
    """Run ``schedule`` on ``costs`` (default: the schedule's, else unit costs); see the module doc.

    ``memory`` (default: the schedule's, else ``MemorySpec()``) sets the weights
    used for peak memory and the limit used by the bounds.
    """
    costs = resolve_costs(schedule, costs)
    memory = memory or schedule.memory or MemorySpec()
    graph, order = compile_schedule(schedule, costs, memory)
    times = time_order(graph, order)
    if not times.finished(order):
        raise _stuck_error(schedule, graph, order, times)
    by_rank = [_events(graph, rank, seq, times) for rank, seq in enumerate(order)]
    peaks = _peaks(schedule, memory, graph, order)
    stats = tuple(_rank_stats(rank, by_rank[rank], peaks[rank]) for rank in range(schedule.ranks))
    events = tuple(event for rank_events in by_rank for event in rank_events)
    return Timeline(schedule.name, schedule.ranks, schedule.stages, schedule.microbatches,
                    events, costs, memory, stats, schedule, graph)


def _peaks(schedule: Schedule, memory: MemorySpec, graph: WorkGraph, order: Order) -> list[float]:
    """Each rank's peak memory: from the work graph's compute nodes, or, when the schedule gathers
    parameters whose size the memory spec declares, from every step of its program."""
    if not memory.unsharded or not any(a.kind in PARAMETER_MEMORY for p in schedule.programs for s in p
                                       for a in s.actions):
        return [peak_memory(graph, seq) for seq in order]
    effect = effects_of(memory, (a for _, _, a in schedule.actions()))
    return [program_peak(program, memory, effect) for program in schedule.programs]


def program_peak(program: tuple[Step, ...], memory: MemorySpec, effect=None) -> float:
    """The most a rank holds after the additions of any step of ``program`` (compute, UNSHARD and
    RESHARD: ``semantics.stage_effect``), never less than 0 (``effect``: ``semantics.effects_of`` the
    whole schedule, so a recomputed F keeps its checkpoint; default: of this program)."""
    if effect is None:
        effect = effects_of(memory, (a for step in program for a in step.actions))
    walk = held_after_additions([effect(a) for a in step.actions] for step in program)
    return max(0.0, max(walk, default=0.0))


def _events(graph: WorkGraph, rank: int, seq: tuple[int, ...], times: Times) -> list[Event]:
    """One event per step of the rank: its actions back to back."""
    actions, duration, steps, joins = graph.actions, graph.duration, _steps(graph), graph.joins
    start, end = times.start, times.end
    events: list[Event] = []
    if joins is None:
        copy = graph.copy
        for a in seq:
            events.append(Event(rank, steps[a], (actions[a],), start[a], end[a], (duration[a],),
                                "copy" if copy is not None and copy[a] else "compute"))
        return events
    group: list[int] = []
    for a in seq:
        if group and not joins[a]:
            events.append(_event(graph, rank, group, times))
            group = []
        group.append(a)
    if group:
        events.append(_event(graph, rank, group, times))
    return events


def _event(graph: WorkGraph, rank: int, nodes: list[int], times: Times) -> Event:
    lane = "copy" if graph.copy is not None and all(graph.copy[a] for a in nodes) else "compute"
    return Event(rank, _steps(graph)[nodes[0]], tuple(graph.actions[a] for a in nodes), times.start[nodes[0]],
                 times.end[nodes[-1]], tuple(graph.duration[a] for a in nodes), lane)


def _steps(graph: WorkGraph) -> list[int]:
    """Each node's step in its rank's program, which a graph of a schedule has (``compile_schedule``)."""
    assert graph.step is not None, "a graph from compile_schedule numbers every node's step"
    return graph.step


def _stuck_error(schedule: Schedule, graph: WorkGraph, order: Order, times: Times) -> VerificationError:
    """Name every stuck rank: its step, the input it waits for, and where that input would be made."""
    stuck = [r for r, seq in enumerate(order) if times.done[r] < len(seq)]
    steps = _steps(graph)
    lines, spans = [], []
    for rank in stuck:
        node = order[rank][times.done[rank]]
        step = _step_nodes(graph, order[rank], times.done[rank])
        waits = _waits_text(graph, blocking_input(graph, times, node), step)
        lines.append(f"rank {rank} step {steps[node]} ({_step_text(graph, step)}) waits for {waits}")
        spans.append((rank, schedule.programs[rank][steps[node]].span, _step_text(graph, step)))
    message = "the compute order cannot finish: " + "; ".join(lines)
    error = VerificationError(message, span=spans[0][1])
    error.notes = tuple(f"rank {rank} is stuck at {span} ({text})" for rank, span, text in spans[1:]
                        if span is not None)
    return error


def _step_nodes(graph: WorkGraph, seq: tuple[int, ...], position: int) -> list[int]:
    """The nodes of the step that starts at ``position`` of a rank's order."""
    nodes = [seq[position]]
    joins = graph.joins
    while joins is not None and position + len(nodes) < len(seq) and joins[seq[position + len(nodes)]]:
        nodes.append(seq[position + len(nodes)])
    return nodes


def _waits_text(graph: WorkGraph, producer: int, step: list[int]) -> str:
    if producer >= len(graph.actions):
        alternatives = graph.phantoms[producer - len(graph.actions)]
        return f"{' or '.join(str(as_action(a)) for a in alternatives)}, which no rank runs"
    if producer in step:
        return f"{graph.actions[producer]}, in the same step (actions of one step do not feed each other)"
    return f"{graph.actions[producer]} (rank {graph.rank[producer]} step {_steps(graph)[producer]}, not yet run)"


def _step_text(graph: WorkGraph, nodes: list[int]) -> str:
    return str(Step(tuple(graph.actions[a] for a in nodes), overlap=len(nodes) > 1))


def _rank_stats(rank: int, events: list[Event], peak: float) -> RankStats:
    if not events:
        return RankStats(rank, 0.0, 0.0, 0.0, 0.0, 0)
    busy = sum(e.end - e.start for e in events if e.lane == "compute")  # the copy lane is not busy time
    count = sum(len(e.actions) for e in events)
    return RankStats(rank, busy, min(e.start for e in events), max(e.end for e in events), peak, count)
