"""Offloads placed where their transfers hide behind compute.

``hidden_offloads(schedule, costs, memory)`` -> the compute-only ``schedule`` with, for every (stage,
microbatch) whose activations wait long enough between its F and its backward, an OFFLOAD written after
the compute action from whose end the copy lane can move them out before the rank's next action that adds
memory starts, and a RELOAD written after the latest compute action from whose end they are back before
the backward starts, both in the schedule's own timing (``simulate``; the copy lane taken one transfer at
a time). Nothing else moves. The caller simulates and verifies what it gets (the transfers may still
delay some action where the lane is busy).
"""

from __future__ import annotations

from pipeforge.ir import Action, ActionKind, CostModel, MemorySpec, Schedule, Step, replace_programs
from pipeforge.sim.simulate import simulate

F, B, I, OFFLOAD, RELOAD = ActionKind.F, ActionKind.B, ActionKind.I, ActionKind.OFFLOAD, ActionKind.RELOAD


def hidden_offloads(schedule: Schedule, costs: CostModel, memory: MemorySpec) -> Schedule:
    """The schedule with the offloads of the module doc (one compute action a step expected)."""
    timeline = simulate(schedule, costs, memory=memory)
    times = {(e.rank, e.step): (e.start, e.end) for e in timeline.events}
    programs = []
    for r, program in enumerate(schedule.programs):
        steps = [(i, step) for i, step in enumerate(program) if step.is_compute and len(step.actions) == 1]
        programs.append(_rank_program(program, steps, times, r, costs))
    return replace_programs(schedule, tuple(programs))


def _rank_program(program, steps, times, r: int, costs: CostModel) -> tuple[Step, ...]:
    """Rank r's program with OFFLOAD and RELOAD steps inserted (after the step index they follow)."""
    after: dict[int, list[Step]] = {}
    lane = 0.0  # when the copy lane is free, in the schedule's timing
    adds = [i for i, step in steps if step.actions[0].kind is F]
    backward = {(s.actions[0].stage, s.actions[0].microbatch): i for i, s in steps if s.actions[0].kind in (B, I)}
    inserted: list[tuple[float, float, Action]] = []
    for i, step in steps:
        action = step.actions[0]
        if action.kind is not F or (action.stage, action.microbatch) not in backward:
            continue
        cost = costs.duration(OFFLOAD, action.stage)
        back = backward[(action.stage, action.microbatch)]
        back_start = times[(r, back)][0]
        out_after = _offload_point(steps, times, r, i, back, adds, cost, lane)
        if out_after is None:
            continue
        out_start = max(times[(r, out_after)][1], lane)
        reload_cost = costs.duration(RELOAD, action.stage)
        in_after = _reload_point(steps, times, r, out_after, back, out_start + cost, reload_cost, back_start)
        if in_after is None:
            continue
        lane = out_start + cost
        key = (action.stage, action.microbatch, action.chain)
        after.setdefault(out_after, []).append(Step((Action(key[0], OFFLOAD, key[1], key[2]),), span=step.span))
        after.setdefault(in_after, []).append(Step((Action(key[0], RELOAD, key[1], key[2]),), span=step.span))
        inserted.append((out_start, out_start + cost, action))
    found: list[Step] = []
    for i, step in enumerate(program):
        found.append(step)
        found.extend(after.get(i, ()))
    return tuple(found)


def _offload_point(steps, times, r, forward: int, back: int, adds: list[int], cost: float, lane: float):
    """The first step at or after the F (before its backward) after which the transfer ends before the
    next F after it starts; None if there is none."""
    positions = [i for i, _ in steps if forward <= i < back]
    for i in positions:
        start = max(times[(r, i)][1], lane)
        following = next((j for j in adds if j > i), None)
        if following is None or times[(r, following)][0] >= start + cost - 1e-9:
            return i
    return None


def _reload_point(steps, times, r, out_after: int, back: int, away: float, cost: float, back_start: float):
    """The latest step before the backward (and after the offload) from whose end the reload is back
    before the backward starts; None if there is none."""
    best = None
    for i, _ in steps:
        if out_after < i < back and max(times[(r, i)][1], away) + cost <= back_start + 1e-9:
            best = i
    return best


__all__ = ["hidden_offloads"]
