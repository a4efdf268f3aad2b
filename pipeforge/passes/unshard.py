"""unshard: UNSHARD each stage's parameters ahead of their use and RESHARD them after (FSDP).

``unshard(schedule, max_active_stages=3)`` -> torch's ``_add_unshard_reshard``, on every rank: before
each compute step, the stages of the next compute steps up to ``max_active_stages`` distinct ones are
gathered (UNSHARD in order of first use) and a gathered stage outside that window is resharded; what is
still gathered at the end is resharded in stage order. Other steps stay where they are, so it works on
compute-only and lowered schedules alike and commutes with ``lower``. A schedule that already unshards
or reshards is refused. The window: ``docs/passes.md``.
"""

from __future__ import annotations

from pipeforge.errors import UsageError
from pipeforge.ir import Action, ActionKind, Schedule, Step, replace_programs

UNSHARD, RESHARD = ActionKind.UNSHARD, ActionKind.RESHARD


def unshard(schedule: Schedule, max_active_stages: int = 3) -> Schedule:
    """``schedule`` with UNSHARD/RESHARD steps keeping at most ``max_active_stages`` stages gathered per rank."""
    if max_active_stages < 1:
        raise UsageError(f"max_active_stages must be at least 1 (stages gathered at once), got {max_active_stages}")
    for rank, index, action in schedule.actions():
        if action.kind in (UNSHARD, RESHARD):
            raise UsageError(f"the schedule already has {action} (rank {rank}, step {index}); unshard adds "
                             f"UNSHARD/RESHARD to a schedule without them")
    programs = tuple(unshard_program(program, max_active_stages) for program in schedule.programs)
    return replace_programs(schedule, programs)


def unshard_program(program: tuple[Step, ...], bound: int) -> tuple[Step, ...]:
    uses = [(index, stages_of(step)) for index, step in enumerate(program) if step.is_compute]
    window_at = dict(zip((index for index, _ in uses), windows(uses, bound)))
    gathered: list[int] = []  # in the order they were unsharded
    out: list[Step] = []
    for index, step in enumerate(program):
        window = window_at.get(index)
        if window is not None:
            out.extend(stage_step(stage, RESHARD, step) for stage in gathered if stage not in window)
            fetch = [stage for stage in window if stage not in gathered]
            out.extend(stage_step(stage, UNSHARD, step) for stage in fetch)
            gathered = [stage for stage in gathered if stage in window] + fetch
        out.append(step)
    last = program[uses[-1][0]] if uses else None
    out.extend(stage_step(stage, RESHARD, last) for stage in sorted(gathered))
    return tuple(out)


def stages_of(step: Step) -> tuple[int, ...]:
    """The distinct stages a compute step works on, in written order."""
    return tuple(dict.fromkeys(action.stage for action in step.actions))


def windows(uses: list[tuple[int, tuple[int, ...]]], bound: int) -> list[list[int]]:
    """For each compute step, the first ``bound`` distinct stages used from it on.

    Computed from the back, with each stage's next use: the stages first used at one
    step join the window together (an overlap step may take it past ``bound``, as in
    torch), so the cost is the steps times the stages of the rank, not steps squared.
    """
    next_use: dict[int, int] = {}  # stage -> the first compute step at or after the current one using it
    found: list[list[int]] = []
    for position in reversed(range(len(uses))):
        for stage in uses[position][1]:
            next_use[stage] = position
        found.append(window_from(next_use, uses, bound))
    found.reverse()
    return found


def window_from(next_use: dict[int, int], uses, bound: int) -> list[int]:
    window: list[int] = []
    for position in sorted(set(next_use.values())):
        window.extend(stage for stage in uses[position][1] if next_use[stage] == position)
        if len(window) >= bound:
            break
    return window


def stage_step(stage: int, kind: ActionKind, near: Step | None) -> Step:
    """A stage-only step, reported at the compute step it serves."""
    return Step((Action(stage, kind),), span=near.span if near is not None else None)
