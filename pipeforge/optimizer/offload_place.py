"""Offloads placed so that a compute order keeps a memory limit with its transfers hidden behind compute.

``placed_offloads(schedule, costs, memory, slack)`` -> the compute-only ``schedule`` (one action a step)
with OFFLOAD and RELOAD steps inserted, or None where it cannot keep ``memory.limit``. Walking each rank's
program against the order's own timing with no limit (``simulate``), a forward is offloaded, its OFFLOAD
right after it, where what the rank holds in program order would pass ``limit - slack`` before its backward
and its activations wait long enough to go out and come back; its RELOAD goes after the latest compute
step from whose end (the rank's copy lane taken one transfer at a time, in program order) it is back by
the backward's start. The copy lane rule (``semantics.offload_waits``) makes a later addition wait only
where the limit needs it, so a ``slack`` of one activation leaves room for the transfer in flight. Nothing
else moves; the caller simulates and verifies what it gets. ``weights_within(schedule, memory, budget)``
first brings W forward where the weight-gradient parts, which no transfer moves, would leave too little
room. How: ``docs/optimize.md``.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from dataclasses import replace

from pipeforge.ir import Action, ActionKind, CostModel, MemorySpec, Schedule, Step, replace_programs
from pipeforge.semantics import effects_of, held_after_additions
from pipeforge.sim.simulate import simulate

F, B, I, OFFLOAD, RELOAD = ActionKind.F, ActionKind.B, ActionKind.I, ActionKind.OFFLOAD, ActionKind.RELOAD


def placed_offloads(schedule: Schedule, costs: CostModel, memory: MemorySpec, slack: float = 1.0) -> Schedule | None:
    """The schedule with the offloads of the module doc, or None where the limit is not kept."""
    limit = memory.limit
    if limit is None:
        return schedule
    timeline = simulate(schedule, costs, memory=replace(memory, limit=None))
    times = {(e.rank, e.step): (e.start, e.end) for e in timeline.events}
    effect = effects_of(memory, (a for _, _, a in schedule.actions()))
    programs = []
    for r, program in enumerate(schedule.programs):
        found = _rank_program(r, program, times, effect, costs, limit, slack)
        if found is None:
            return None
        programs.append(found)
    return replace_programs(schedule, tuple(programs))


class _Lane:
    """A rank's copy lane as planned: transfers by program position, each started when issued and the lane is free."""

    def __init__(self) -> None:
        self.positions: list[float] = []
        self.items: list[list[float]] = []  # [issue, duration, start, end], in the order of ``positions``

    def free_before(self, position: float) -> float:
        """When the lane is free of every transfer written before ``position``."""
        at = bisect_right(self.positions, position)
        return self.items[at - 1][3] if at else 0.0

    def add(self, position: float, issue: float, duration: float) -> None:
        at = bisect_right(self.positions, position)
        self.positions.insert(at, position)
        self.items.insert(at, [issue, duration, 0.0, 0.0])
        self._retime(at)

    def remove(self, position: float) -> None:
        at = bisect_left(self.positions, position)
        del self.positions[at], self.items[at]
        self._retime(at)

    def _retime(self, at: int) -> None:
        free = self.items[at - 1][3] if at else 0.0
        for index in range(at, len(self.items)):
            item = self.items[index]
            start = max(item[0], free)
            if index > at and start == item[2]:
                break  # unchanged from here on
            item[2], item[3] = start, start + item[1]
            free = item[3]


def _rank_program(r: int, program, times, effect, costs: CostModel, limit: float, slack: float):
    steps = [(i, step.actions[0]) for i, step in enumerate(program) if step.is_compute]
    if any(len(program[i].actions) != 1 for i, _ in steps):
        return None  # overlap steps: not placed here
    effects = [effect(a) for _, a in steps]
    counts = list(held_after_additions([e] for e in effects))  # in program order, as the rank runs now
    backward = {(a.stage, a.microbatch, a.chain): k for k, (_, a) in enumerate(steps) if a.kind in (B, I)}
    starts = [times[(r, i)][0] for i, _ in steps]
    ends = [times[(r, i)][1] for i, _ in steps]
    lane = _Lane()
    after: dict[int, list[Action]] = {}  # compute step (position among steps) -> the copies written after it
    target = limit - slack
    for k, (_, a) in enumerate(steps):
        if a.kind is not F:
            continue
        key = (a.stage, a.microbatch, a.chain)
        b = backward.get(key)
        if b is None or max(counts[k + 1:b], default=0.0) <= target + 1e-9:
            continue
        size = effects[k][0]
        out, back = costs.duration(OFFLOAD, a.stage), costs.duration(RELOAD, a.stage)
        lane.add(k + 0.25, ends[k], out)
        j = _reload_point(lane, k, b, ends, starts[b], back)
        if j is None:
            lane.remove(k + 0.25)
            continue
        lane.add(j + 0.5 + 1e-6 * k, ends[j], back)
        for n in range(k + 1, j + 1):
            counts[n] -= size
        after.setdefault(k, []).append(Action(a.stage, OFFLOAD, a.microbatch, a.chain))
        after.setdefault(j, []).append(Action(a.stage, RELOAD, a.microbatch, a.chain))
    found: list[Step] = []
    positions = {i: k for k, (i, _) in enumerate(steps)}
    for i, step in enumerate(program):
        found.append(step)
        at = positions.get(i)
        if at is not None:
            copies = sorted(after.get(at, ()), key=lambda c: c.kind is not OFFLOAD)  # its OFFLOAD, then RELOADs
            found.extend(Step((c,), span=step.span) for c in copies)
    every = _program_effects(found, effect)
    if max(held_after_additions(every), default=0.0) > limit + 1e-9:
        return None
    return tuple(found)


def weights_within(schedule: Schedule, memory: MemorySpec, budget: float, backward_budget: float | None = None
                   ) -> Schedule:
    """``schedule`` with each rank's W brought forward, oldest first, to just before an F, B or I where the
    weight-gradient parts its I's leave (I done, W not) pass ``budget`` (M_B): what offloading cannot move
    (an OFFLOAD comes before the I), so that an activation in flight or reloaded has room (before a B or
    I: ``backward_budget``, default ``budget``). Nothing else moves."""
    effect = effects_of(memory, (a for _, _, a in schedule.actions()))
    programs = []
    for program in schedule.programs:
        pending: dict[tuple, tuple[Step, float]] = {}  # (stage, microbatch, chain) -> its W step, its part
        waiting = {(a.stage, a.microbatch, a.chain): step for step in program if step.is_compute
                   for a in step.actions if a.kind is ActionKind.W and len(step.actions) == 1}
        moved: set[tuple] = set()
        held, found = 0.0, []
        for step in program:
            a = step.actions[0] if len(step.actions) == 1 else None
            key = None if a is None else (a.stage, a.microbatch, a.chain)
            if a is not None and a.kind in (F, B, I):  # what adds memory, or (a reloaded I or B) may
                room = budget if a.kind is F or backward_budget is None else backward_budget
                while held > room + 1e-9 and pending:
                    early, (w_step, part) = next(iter(pending.items()))
                    del pending[early]
                    moved.add(early)
                    held -= part
                    found.append(w_step)
            if a is not None and a.kind is ActionKind.W:
                if key in moved:
                    continue
                if key in pending:
                    held -= pending.pop(key)[1]
            found.append(step)
            if a is not None and a.kind is I and key in waiting:
                part = effect(waiting[key].actions[0])[1]
                pending[key] = (waiting[key], part)
                held += part
        programs.append(tuple(found))
    return replace_programs(schedule, tuple(programs))


def _program_effects(program, effect) -> list[list[tuple[float, float]]]:
    return [[effect(a) for a in step.actions] if step.is_compute else [] for step in program]


def _reload_point(lane: _Lane, k: int, b: int, ends: list[float], deadline: float, duration: float) -> int | None:
    """The latest compute step in [k, b) from whose end the RELOAD, behind the transfers written before it,
    is back by ``deadline``; None if none is."""
    for j in range(b - 1, k - 1, -1):
        start = max(ends[j], lane.free_before(j + 0.5 + 1e-6 * k))
        if start + duration <= deadline + 1e-9:
            return j
    return None


__all__ = ["placed_offloads", "weights_within"]
