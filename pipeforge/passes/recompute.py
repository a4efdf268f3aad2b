"""recompute, offload: R before a microbatch's backward; OFFLOAD after its forward and RELOAD before its backward.

``recompute(schedule, which)`` inserts, on the rank running it, an ``R(s, m)``
step just before the first backward (B or I) of each (stage, microbatch, chain)
in ``which`` (default: all of them), so its F keeps only its checkpoint
(``docs/semantics.md``, "Recompute and offload"). ``offload(schedule, which)``
inserts ``OFFLOAD(s, m)`` right after the step of its F and ``RELOAD(s, m)``
just before its first backward. Both keep every other step where it was; a
(stage, microbatch) that already has an R, OFFLOAD or RELOAD is left alone.
What they make verifies whenever the input does (the new steps need only the F
before them and come before the backward).
"""

from __future__ import annotations

from collections.abc import Collection

from pipeforge.ir import Action, ActionKind, Schedule, Step, replace_programs

F, B, I, R = ActionKind.F, ActionKind.B, ActionKind.I, ActionKind.R
OFFLOAD, RELOAD = ActionKind.OFFLOAD, ActionKind.RELOAD
Key = tuple[int, int, int]  # (stage, microbatch, chain)


def recompute(schedule: Schedule, which: Collection[Key] | None = None) -> Schedule:
    """``schedule`` with ``R(s, m)`` before the first backward of every (stage, microbatch, chain) in
    ``which`` (None: every one)."""
    return _insert(schedule, which, before=R, after=None)


def offload(schedule: Schedule, which: Collection[Key] | None = None) -> Schedule:
    """``schedule`` with ``OFFLOAD(s, m)`` after the F and ``RELOAD(s, m)`` before the first backward of
    every (stage, microbatch, chain) in ``which`` (None: every one)."""
    return _insert(schedule, which, before=RELOAD, after=OFFLOAD)


def _insert(schedule: Schedule, which: Collection[Key] | None, before: ActionKind,
            after: ActionKind | None) -> Schedule:
    taken = {(a.stage, a.microbatch, a.chain) for _, _, a in schedule.actions() if a.kind in (R, OFFLOAD, RELOAD)}
    chosen = None if which is None else set(which)

    def wanted(action: Action) -> bool:
        key = (action.stage, action.microbatch, action.chain)
        return key not in taken and (chosen is None or key in chosen)

    programs = []
    for program in schedule.programs:
        steps: list[Step] = []
        forwarded: set[Key] = set()
        restored: set[Key] = set()
        for step in program:
            if step.is_compute:
                for action in step.actions:
                    key = (action.stage, action.microbatch, action.chain)
                    if action.kind in (B, I) and key in forwarded and key not in restored and wanted(action):
                        restored.add(key)
                        steps.append(Step((Action(action.stage, before, action.microbatch, action.chain),),
                                          span=step.span))
            steps.append(step)
            if after is not None and step.is_compute:
                for action in step.actions:
                    if action.kind is F and wanted(action):
                        steps.append(Step((Action(action.stage, after, action.microbatch, action.chain),),
                                          span=step.span))
            if step.is_compute:
                forwarded.update((a.stage, a.microbatch, a.chain) for a in step.actions
                                 if a.kind is F and a.microbatch is not None)  # (an F always has one)
        programs.append(tuple(steps))
    return replace_programs(schedule, tuple(programs))
