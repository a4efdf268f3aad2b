"""Offloads placed so that a compute order keeps a memory limit with its transfers hidden behind compute.

``placed_offloads(schedule, costs, memory, slack)`` -> the compute-only ``schedule`` (one action a step)
with OFFLOAD and RELOAD steps inserted, or None where it cannot keep ``memory.limit``. Against the order's
own timing with no limit, a forward is offloaded (its OFFLOAD right after it) where what the rank holds in
program order would pass ``limit - slack`` before its backward and its activations wait long enough to go
out and come back; its RELOAD goes after the latest compute step from whose end (the copy lane one transfer
at a time, in program order) it is back by the backward's start. The copy lane rule
(``semantics.offload_waits``) makes a later addition wait only where the limit needs it. Nothing else
moves; the caller simulates and verifies. Before it, on the order: ``weights_within`` brings W forward
where the weight-gradient parts, which no transfer moves, leave too little room; ``weights_filled`` runs
the W of each rank's tail earlier where they fit in its waits. After it, ``weights_climbed`` swaps W of
the tails while the placed makespan shrinks. How: ``docs/optimize.md``.
"""

from __future__ import annotations

import time
from bisect import bisect_left, bisect_right
from dataclasses import replace

from pipeforge.ir import Action, ActionKind, CostModel, MemorySpec, Schedule, Step, replace_programs
from pipeforge.semantics import INPUT_GRADIENT_KINDS, PLAIN_KINDS, effects_of, held_after_additions, within_limit
from pipeforge.sim.simulate import simulate
from pipeforge.sim.workgraph import compile_schedule, time_order

F, I, OFFLOAD, RELOAD = ActionKind.F, ActionKind.I, ActionKind.OFFLOAD, ActionKind.RELOAD
HOLDING = frozenset({F}) | INPUT_GRADIENT_KINDS  # an F adds its activations, a B or I (maybe reloaded) uses them


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
    backward = {(a.stage, a.microbatch, a.chain): k for k, (_, a) in enumerate(steps) if a.kind in INPUT_GRADIENT_KINDS}
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
    if not within_limit(max(held_after_additions(every), default=0.0), limit):
        return None
    return tuple(found)


def weights_within(schedule: Schedule, memory: MemorySpec, budget: float, backward_budget: float | None = None,
                   direct_budget: float | None = None) -> Schedule:
    """``schedule`` with each rank's W brought forward, oldest first, to just before an F, B or I where the
    weight-gradient parts its I's leave (I done, W not) pass ``budget`` (M_B): what offloading cannot move
    (an OFFLOAD comes before the I), so that an activation in flight or reloaded has room (before a B or
    I: ``backward_budget``, default ``budget``). On a rank where each F's next F, B or I is its own
    backward (the last stage of 1F1B's shape), no activation is ever in flight or reloaded beside the one
    it computes: there ``direct_budget`` where given. Nothing else moves."""
    effect = effects_of(memory, (a for _, _, a in schedule.actions()))
    programs = []
    for program in schedule.programs:
        room_f, room_b = (direct_budget, direct_budget) if direct_budget is not None and _direct(program) else (
            budget, backward_budget)
        pending: dict[tuple, tuple[Step, float]] = {}  # (stage, microbatch, chain) -> its W step, its part
        waiting = {(a.stage, a.microbatch, a.chain): step for step in program if step.is_compute
                   for a in step.actions if a.kind is ActionKind.W and len(step.actions) == 1}
        moved: set[tuple] = set()
        held, found = 0.0, []
        for step in program:
            a = step.actions[0] if len(step.actions) == 1 else None
            key = None if a is None else (a.stage, a.microbatch, a.chain)
            if a is not None and a.kind in HOLDING:  # what adds memory, or (a reloaded I or B) may
                room = room_f if a.kind is F or room_b is None else room_b
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


def weights_filled(schedule: Schedule, costs: CostModel, memory: MemorySpec) -> Schedule:
    """``schedule`` (compute only, one action a step) with the W after each rank's last F run earlier where
    they fit: rank by rank, the last first (a rank's backwards wait for the rank after it), each W of that
    tail, oldest first, moved to the wait before a backward where it ends by the time the backward's inputs
    are there (timed with no limit, as ``placed_offloads`` times), never later than it was, nor before its
    own backward. So the W a rank holds back shrink where its backwards come apart (what the makespan
    ends with) and nothing waits longer for them; a W earlier only releases earlier."""
    graph, order = compile_schedule(schedule, costs, replace(memory, limit=None))
    ends = time_order(graph, order).end  # a rank's new tail timed as it is built, for the rank before it
    programs = list(schedule.programs)
    for r in reversed(range(len(programs))):
        program = _filled(programs[r], order[r], graph, ends)
        if program is not None:
            programs[r] = program
    return replace_programs(schedule, tuple(programs))


def _filled(program, nodes, graph, ends: list[float]) -> tuple[Step, ...] | None:
    """Rank's ``program`` with its tail re-sequenced as ``weights_filled`` says (``ends``, each node's end,
    updated for it); None where it has no such tail."""
    if len(nodes) != len(program) or any(not _single(step, PLAIN_KINDS) for step in program):
        return None
    acts = [graph.actions[n] for n in nodes]
    last = max((k for k, a in enumerate(acts) if a.kind is F), default=-1)
    tail = range(last + 1, len(nodes))
    backs = [k for k in tail if acts[k].kind is not ActionKind.W]
    weights = [k for k in tail if acts[k].kind is ActionKind.W]
    due = {k: sum(1 for b in backs if b < k) for k in weights}  # how many backwards it came after
    done = {(a.stage, a.microbatch, a.chain) for a in acts[:last + 1] if a.kind in INPUT_GRADIENT_KINDS}
    free = ends[nodes[last]] if last >= 0 else 0.0
    found, w = [], 0
    for j, b in enumerate(backs):
        ready = max([free] + [ends[d] + latency for d, latency in graph.waits[nodes[b]]])
        while w < len(weights) and (acts[weights[w]].stage, acts[weights[w]].microbatch, acts[weights[w]].chain
                                    ) in done and (due[weights[w]] <= j or
                                                   free + graph.duration[nodes[weights[w]]] <= ready + 1e-9):
            free += graph.duration[nodes[weights[w]]]
            ends[nodes[weights[w]]] = free
            found.append(weights[w])
            w += 1
        free = max(free, ready) + graph.duration[nodes[b]]
        ends[nodes[b]] = free
        found.append(b)
        done.add((acts[b].stage, acts[b].microbatch, acts[b].chain))
    found += weights[w:]
    return tuple(program[:last + 1]) + tuple(program[k] for k in found)


def weights_climbed(schedule: Schedule, costs: CostModel, memory: MemorySpec, deadline: float, slack: float = 1.0,
                    window: int = 16) -> tuple[Schedule, Schedule, float] | None:
    """Hill climbing on the compute-only ``schedule`` (one action a step) until no move helps or
    ``time.monotonic()`` passes ``deadline``: a W among the last ``window`` steps of a rank (the last rank
    first) swapped with the step before it (not its own I) or after it, kept where the makespan of its
    ``placed_offloads`` (with ``slack``, timed under ``memory.limit``) shrinks. The order, its placed
    schedule and that makespan; None where ``schedule`` itself cannot be placed."""
    def placed(order: Schedule) -> tuple[Schedule, float] | None:
        moved = placed_offloads(order, costs, memory, slack)
        return None if moved is None else (moved, simulate(moved, costs, memory=memory).makespan)

    first = placed(schedule)
    if first is None:
        return None
    best, (moved, span) = schedule, first
    better = True
    while better and time.monotonic() < deadline:
        better = False
        for r in reversed(range(len(best.programs))):
            for trial in _swaps(best, r, window):
                if time.monotonic() >= deadline:
                    return best, moved, span
                found = placed(trial)
                if found is not None and found[1] < span - 1e-9:
                    best, (moved, span), better = trial, found, True
                    break
    return best, moved, span


def _swaps(schedule: Schedule, r: int, window: int):
    """``schedule`` with one W of rank r's last ``window`` steps swapped with a neighbour (module doc)."""
    program = schedule.programs[r]
    for k in range(len(program) - 1, max(0, len(program) - window) - 1, -1):
        if not _single(program[k], (ActionKind.W,)):
            continue
        a = program[k].actions[0]
        for j in (k - 1, k + 1):
            if not 0 <= j < len(program) or not _single(program[j], PLAIN_KINDS):
                continue
            b = program[j].actions[0]
            own = (b.stage, b.microbatch, b.chain) == (a.stage, a.microbatch, a.chain)
            if j < k and b.kind in INPUT_GRADIENT_KINDS and own:
                continue
            swapped = list(program)
            swapped[k], swapped[j] = swapped[j], swapped[k]
            yield replace_programs(schedule, tuple(tuple(swapped) if q == r else p
                                                   for q, p in enumerate(schedule.programs)))


def _single(step: Step, kinds) -> bool:
    return len(step.actions) == 1 and step.actions[0].kind in kinds


def _direct(program) -> bool:
    """Whether each F of ``program`` (one action a step) is followed, among its F, B and I, by its own backward."""
    kinds = [step.actions[0] for step in program if len(step.actions) == 1 and step.actions[0].kind in HOLDING]
    return all(a.kind is not F or (k + 1 < len(kinds) and kinds[k + 1].kind is not F and
                                   (kinds[k + 1].stage, kinds[k + 1].microbatch, kinds[k + 1].chain)
                                   == (a.stage, a.microbatch, a.chain))
               for k, a in enumerate(kinds))


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


__all__ = ["placed_offloads", "weights_climbed", "weights_filled", "weights_within"]
