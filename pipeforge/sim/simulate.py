"""Event simulation of a schedule's compute on a cost model.

What is simulated (the compute-only view):

- Each rank runs its compute steps in program order; communication groups,
  ``REDUCE_GRAD`` and idle slots take no time and are skipped.
- A step starts when its rank is free and every input of every action in it
  has arrived. Inputs (docs/semantics.md): ``F(s,m)`` needs ``F(s-1,m)``;
  ``B/I(s,m)`` needs ``F(s,m)`` and ``B/I(s+1,m)``; ``W(s,m)`` needs
  ``I(s,m)``. Chains of a bidirectional schedule never feed each other.
- An input made on another rank arrives ``costs.comm`` after it was made; one
  made on the same rank arrives when it is made.
- An overlap step ``(0F7;7B3)`` lasts the *sum* of its actions' durations: the
  actions share one GPU's compute, and what overlapping buys (hiding the
  communication of one behind the compute of the other) is already outside
  this compute-only view. Its actions are drawn back to back in written order.
- Memory per rank, in program order: F adds 1, I releases ``1 - weights``,
  W releases ``weights``, B releases 1 (units of M_B); within a step additions
  come first, so an overlap step's peak counts its forward before its backward.

The pass is linear: each step is looked at once when its rank reaches it and
once more each time a missing input it waits for is made. If ranks are left
waiting for inputs that never come, the order is inconsistent and a
``VerificationError`` names every stuck rank, its step and what it waits for.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import NamedTuple

from pipeforge._gc import gc_paused
from pipeforge.errors import VerificationError
from pipeforge.ir import Action, ActionKind, CostModel, MemorySpec, Schedule, Step
from pipeforge.sim.costs import costs_to_json, duration_table, resolve_costs

_F, _B, _I, _W = ActionKind.F, ActionKind.B, ActionKind.I, ActionKind.W
# The compute kinds (what a finished action makes available: F -> "F"; B, I -> "G", the input gradient; I -> "I").
_COMPUTE = frozenset({_F, _B, _I, _W})


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

    @cached_property
    def bounds(self):
        """Lower bounds (pipeforge.sim.bounds.Bounds), computed on first use.

        The memory bound is left out when this schedule itself breaks the limit.
        """
        from pipeforge.sim.bounds import compute_bounds

        memory = self.memory
        if self.within_memory_limit is False:  # the memory bound speaks only of orders within the limit
            memory = replace(memory, limit=None)
        return compute_bounds(self.schedule, self.costs, memory, busy=[s.busy for s in self.rank_stats])

    @property
    def makespan(self) -> float:
        return max((s.end for s in self.rank_stats if s.actions), default=0.0)

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
        return all(peak <= self.memory.limit + 1e-9 for peak in self.peak_memory)

    @cached_property
    def events_by_rank(self) -> tuple[tuple[Event, ...], ...]:
        by_rank: list[list[Event]] = [[] for _ in range(self.ranks)]
        for event in self.events:
            by_rank[event.rank].append(event)
        return tuple(tuple(events) for events in by_rank)

    def events_on(self, rank: int) -> tuple[Event, ...]:
        """Rank ``rank``'s events in program order."""
        return self.events_by_rank[rank]

    def to_json(self) -> dict:
        return {
            "schedule": self.name,
            "makespan": self.makespan,
            "bubble_rate": self.bubble_rate,
            "peak_memory": list(self.peak_memory),
            "lower_bound": self.lower_bound,
            "bubble_lower_bound": self.bubble_lower_bound,
            "gap": self.gap,
            "bounds": self.bounds.to_json(),
            "costs": costs_to_json(self.costs),
            "memory": {"limit": self.memory.limit, "weights": self.memory.weights,
                       "within_limit": self.within_memory_limit},
            "ranks": [s.to_json() for s in self.rank_stats],
        }


def bubble_rate_of(busy: list[float], spans: list[float]) -> float:
    longest = max(spans, default=0.0)
    if longest <= 0:
        return 0.0
    return 1.0 - (sum(busy) / len(busy)) / longest


def simulate(schedule: Schedule, costs: CostModel | None = None, *, memory: MemorySpec | None = None) -> Timeline:
    """Run ``schedule`` on ``costs`` (default: the schedule's, else unit costs); see the module doc.

    ``memory`` (default: the schedule's, else ``MemorySpec()``) sets the weights
    used for peak memory and the limit used by the bounds.
    """
    costs = resolve_costs(schedule, costs)
    memory = memory or schedule.memory or MemorySpec()
    with gc_paused():
        run = _run(schedule, costs, memory)
        by_rank, peaks = run.events, run.peak
        del run  # free the run's ~10^5 working tuples by reference counting, before the collector sees them
        stats = tuple(_rank_stats(rank, by_rank[rank], peaks[rank]) for rank in range(schedule.ranks))
        events = tuple(event for rank_events in by_rank for event in rank_events)
    return Timeline(schedule.name, schedule.ranks, schedule.stages, schedule.microbatches,
                    events, costs, memory, stats, schedule)


class _Run:
    """The state of one simulation: per-rank pointers, what has been made and when, who waits."""

    def __init__(self, schedule: Schedule, costs: CostModel, memory: MemorySpec):
        compiler = self.compiler = _StepCompiler(schedule, costs, memory)
        self.programs = [[compiler.compile(i, step) for i, step in enumerate(program)
                          if step.actions and step.actions[0].kind in _COMPUTE]
                         for program in schedule.programs]
        ranks = schedule.ranks
        self.pointer = [0] * ranks
        self.free = [0.0] * ranks
        self.held = [0.0] * ranks
        self.peak = [0.0] * ranks
        self.made: dict[tuple, tuple[float, int]] = {}
        self.waiting: dict[tuple, list[int]] = defaultdict(list)
        self.blocked_on: dict[int, tuple] = {}
        self.events: list[list[Event]] = [[] for _ in range(ranks)]

    def advance(self, rank: int, ready_ranks: list[int]) -> None:
        """Run ``rank`` until it finishes or waits for an input not yet made."""
        program, made = self.programs[rank], self.made
        pointer, start = self.pointer[rank], self.free[rank]
        while pointer < len(program):
            step = program[pointer]
            for key, latency in zip(step.inputs, step.latencies):
                found = made.get(key)
                if found is None:
                    self.waiting[key].append(rank)
                    self.blocked_on[rank] = key
                    self.pointer[rank], self.free[rank] = pointer, start
                    return
                arrival = found[0] + latency if found[1] != rank else found[0]
                if arrival > start:
                    start = arrival
            start = self.finish(rank, step, start, ready_ranks)
            pointer += 1
        self.blocked_on.pop(rank, None)
        self.pointer[rank], self.free[rank] = pointer, start

    def finish(self, rank: int, step: _CompiledStep, start: float, ready_ranks: list[int]) -> float:
        end = start + step.duration
        self.events[rank].append(Event(rank, step.index, step.actions, start, end, step.durations))
        held = self.held[rank] + step.memory_added
        if held > self.peak[rank]:
            self.peak[rank] = held
        self.held[rank] = held - step.memory_released
        for key in step.outputs:
            if key not in self.made:
                self.made[key] = (end, rank)
                waiters = self.waiting.pop(key, None)
                if waiters:
                    ready_ranks.extend(waiters)
        return end


class _CompiledStep(NamedTuple):
    index: int
    actions: tuple[Action, ...]
    inputs: tuple[tuple, ...]
    latencies: tuple[float, ...]  # of each input's edge when it comes from another rank
    outputs: tuple[tuple, ...]
    durations: tuple[float, ...]
    duration: float
    memory_added: float
    memory_released: float
    span: object


class _StepCompiler:
    """Turns a compute step into what the hot loop needs: input and output keys, durations, memory."""

    def __init__(self, schedule: Schedule, costs: CostModel, memory: MemorySpec):
        self.last_stage = schedule.stages - 1
        self.costs, self.memory = costs, memory
        table = duration_table(costs, schedule.stages)

        stages = range(schedule.stages)

        def profile(kind: ActionKind) -> tuple[list[float], list[float], list[float]]:
            effects = [memory.stage_effect(kind, stage) for stage in stages]
            return [table[kind, stage] for stage in stages], [a for a, _ in effects], [r for _, r in effects]

        # Per kind: (duration, memory added, memory released), each by stage. Picked by identity, not hashing.
        self.forward = profile(_F)
        self.backward = profile(_B)
        self.inputs_backward = profile(_I)
        self.weights_backward = profile(_W)

    def compile(self, index: int, step: Step) -> _CompiledStep:
        if len(step.actions) == 1:
            return self.compile_single(index, step)
        parts = [self.compile_single(index, Step((action,))) for action in step.actions]
        durations = tuple(part.duration for part in parts)
        return _CompiledStep(index, step.actions, sum((p.inputs for p in parts), ()),
                             sum((p.latencies for p in parts), ()),
                             sum((p.outputs for p in parts), ()), durations, sum(durations),
                             sum(p.memory_added for p in parts), sum(p.memory_released for p in parts), step.span)

    def compile_single(self, index: int, step: Step) -> _CompiledStep:
        """The common case, kept lean: it runs once per action of a 100k-action schedule."""
        action = step.actions[0]
        kind, c, s, m = action.kind, action.chain, action.stage, action.microbatch
        if kind is _F:
            profile = self.forward
            inputs = (("F", c, s - 1, m),) if s > 0 else ()
            outputs = (("F", c, s, m),)
        elif kind is _W:
            profile = self.weights_backward
            inputs = (("I", c, s, m),)
            outputs = ()
        else:
            inputs = (("F", c, s, m), ("G", c, s + 1, m)) if s < self.last_stage else (("F", c, s, m),)
            if kind is _I:
                profile = self.inputs_backward
                outputs = (("G", c, s, m), ("I", c, s, m))
            else:
                profile = self.backward
                outputs = (("G", c, s, m),)
        row, adds, releases = profile
        if 0 <= s < len(row):
            duration, added, released = row[s], adds[s], releases[s]
        else:
            duration, (added, released) = self.costs.duration(kind, s), self.memory.stage_effect(kind, s)
        latencies = tuple(self.costs.latency(key[2], s) for key in inputs)
        return _CompiledStep(index, step.actions, inputs, latencies, outputs, (duration,), duration, added, released,
                             step.span)



def _run(schedule: Schedule, costs: CostModel, memory: MemorySpec) -> _Run:
    run = _Run(schedule, costs, memory)
    ready_ranks = list(range(schedule.ranks))
    while ready_ranks:
        run.advance(ready_ranks.pop(), ready_ranks)
    stuck = [r for r in range(schedule.ranks) if run.pointer[r] < len(run.programs[r])]
    if stuck:
        raise _stuck_error(run, stuck)
    return run


def _key_text(key: tuple) -> str:
    made_kind, chain, stage, mb = key
    chain_text = f"@{chain}" if chain else ""
    if made_kind == "G":
        return f"{stage}B{mb}{chain_text} or {stage}I{mb}{chain_text}"
    return f"{stage}{made_kind}{mb}{chain_text}"


def _stuck_error(run: _Run, stuck: list[int]) -> VerificationError:
    """Name every stuck rank: its step, the input it waits for, and where that input would be made."""
    makers = _makers(run)
    lines = []
    for rank in stuck:
        step = run.programs[rank][run.pointer[rank]]
        key = run.blocked_on[rank]
        maker = makers.get(key)
        if maker is None:
            waits = f"{_key_text(key)}, which no rank runs"
        elif maker[1] is step:
            waits = f"{maker[2]}, in the same step (actions of one step do not feed each other)"
        else:
            m_rank, m_step, m_action = maker
            waits = f"{m_action} (rank {m_rank} step {m_step.index}, not yet run)"
        lines.append(f"rank {rank} step {step.index} ({_step_text(step)}) waits for {waits}")
    steps = [run.programs[rank][run.pointer[rank]] for rank in stuck]
    message = "the compute order cannot finish: " + "; ".join(lines)
    error = VerificationError(message, span=steps[0].span)
    error.notes = tuple(f"rank {rank} is stuck at {step.span} ({_step_text(step)})"
                        for rank, step in zip(stuck[1:], steps[1:]) if step.span is not None)
    return error


def _step_text(step: _CompiledStep) -> str:
    return str(Step(step.actions, overlap=len(step.actions) > 1))


def _makers(run: _Run) -> dict[tuple, tuple[int, _CompiledStep, Action]]:
    """For every input key, the first (rank, step, action) in the programs that makes it."""
    makers: dict[tuple, tuple[int, _CompiledStep, Action]] = {}
    for rank, program in enumerate(run.programs):
        for step in program:
            for action in step.actions:
                for key in run.compiler.compile_single(step.index, Step((action,))).outputs:
                    makers.setdefault(key, (rank, step, action))
    return makers


def _rank_stats(rank: int, events: list[Event], peak: float) -> RankStats:
    if not events:
        return RankStats(rank, 0.0, 0.0, 0.0, 0.0, 0)
    busy = sum(e.end - e.start for e in events)
    count = sum(len(e.actions) for e in events)
    return RankStats(rank, busy, events[0].start, events[-1].end, peak, count)
