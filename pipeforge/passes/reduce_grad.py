"""reduce_grad: REDUCE_GRAD of each stage right after its last backward on each rank.

torch's ``_add_reduce_grad``: once a rank has run the last B or W of a stage (the
M-th, in torch, which counts them), the stage's gradients are complete there and
their reduction (FSDP's reduce-scatter, data parallelism's all-reduce) may start.
REDUCE_GRAD names the stage, not a chain: a rank holding a stage in two chains
reduces it once, after the last backward of either.

The steps are placed by ``lower``'s rule (``last_backwards``: one place for it) and
a rank that already reduces a stage keeps its own REDUCE_GRAD, so the pass is
idempotent, ``reduce_grad(lower(s)) == lower(s)``, and on a compute-only schedule
it writes out what ``lower`` would insert.
"""

from __future__ import annotations

from collections.abc import Iterator

from pipeforge.ir import Action, ActionKind, Schedule, Step, replace_programs
from pipeforge.passes.lower import last_backwards


def reduce_grad(schedule: Schedule) -> Schedule:
    """``schedule`` with a REDUCE_GRAD after the last B/W of every stage on every rank that lacks one."""
    after = last_backwards(schedule)
    programs = tuple(
        tuple(reduced_program(rank, program, after)) for rank, program in enumerate(schedule.programs)
    )
    return replace_programs(schedule, programs)


def reduced_program(rank: int, program: tuple[Step, ...], after: dict[tuple[int, int], list[int]]
                    ) -> Iterator[Step]:
    for index, step in enumerate(program):
        yield step
        for stage in after.get((rank, index), ()):
            yield Step((Action(stage, ActionKind.REDUCE_GRAD),), span=step.span)
