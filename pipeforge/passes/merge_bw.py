"""merge_bw: an I immediately followed by the W of the same stage and microbatch becomes one B.

torch's ``_merge_bw``: where a rank runs a stage's backward for inputs and then,
with nothing in between, its backward for weights, one full backward does the
same work in one autograd pass. "Immediately" skips idle slots and communication
groups (torch merges before communication is inserted), so the pass gives the same
compute order on a compute-only schedule and on its lowering; an overlap step or a
stage-only step (REDUCE_GRAD, UNSHARD, RESHARD) in between keeps the two apart.
The B takes the I's place; the W's step goes.
"""

from __future__ import annotations

from pipeforge.ir import Action, ActionKind, Schedule, Step, replace_programs

I, W, B = ActionKind.I, ActionKind.W, ActionKind.B


def merge_bw(schedule: Schedule) -> Schedule:
    """``schedule`` with every I directly followed by its W merged into a B."""
    return replace_programs(schedule, tuple(merge_program(program) for program in schedule.programs))


def merge_program(program: tuple[Step, ...]) -> tuple[Step, ...]:
    merged = list(program)
    dropped: set[int] = set()
    for index, step in enumerate(program):
        partner = next_compute_or_stage_step(program, index)
        if partner is not None and index not in dropped and merges(step, program[partner]):
            merged[index] = Step((Action(step.actions[0].stage, B, step.actions[0].microbatch,
                                         step.actions[0].chain),), span=step.span)
            dropped.add(partner)
    return tuple(step for index, step in enumerate(merged) if index not in dropped)


def next_compute_or_stage_step(program: tuple[Step, ...], index: int) -> int | None:
    """The next step after ``index`` that is neither idle nor a communication group."""
    for later in range(index + 1, len(program)):
        if not program[later].is_idle and not program[later].is_group:
            return later
    return None


def merges(first: Step, second: Step) -> bool:
    if first.overlap or second.overlap or len(first.actions) != 1 or len(second.actions) != 1:
        return False
    a, b = first.actions[0], second.actions[0]
    return (a.kind is I and b.kind is W and a.stage == b.stage and a.microbatch == b.microbatch
            and a.chain == b.chain)
