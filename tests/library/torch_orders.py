"""torch's own orders for the library's schedules, as pipeforge steps.

torch builds its orders from stand-in stages (``tests/torch_stages.py``); here
they become compute-only programs (idle slots and REDUCE_GRAD dropped, an
``(0F7;7B3)OVERLAP_F_B`` cell an overlap step) and, for verification, Schedules.
"""

from __future__ import annotations

from pipeforge.ir import Placement, Schedule, Step, parse_step
from tests.torch_stages import V_SCHEDULES, torch_pipeline_order

# (V, M, P): every case of torch's own schedule tests
TORCH_TEST_CASES = (
    (2, 2, 2), (2, 4, 4), (2, 8, 2), (2, 8, 4), (2, 8, 8), (4, 4, 4), (4, 8, 4), (4, 8, 8),
    (4, 16, 4), (4, 32, 4), (4, 64, 4), (4, 16, 16), (4, 32, 32), (4, 128, 64), (3, 2, 2),
    (3, 8, 2), (3, 12, 4), (4, 6, 3), (4, 10, 5), (2, 3, 4), (2, 10, 4), (2, 15, 4),
)

# library schedule -> (torch class, stages per rank it takes: None = the case's V)
TORCH_TWINS = {
    "gpipe": ("ScheduleGPipe", 1),
    "1f1b": ("Schedule1F1B", 1),
    "interleaved-1f1b": ("ScheduleInterleaved1F1B", None),
    "looped-bfs": ("ScheduleLoopedBFS", None),
    "interleaved-zb": ("ScheduleInterleavedZeroBubble", None),
    "zbv": ("ScheduleZBVZeroBubble", 2),
    "dualpipev": ("ScheduleDualPipeV", 2),
}

OVERLAP_SUFFIX = "OVERLAP_F_B"


def torch_cases(name: str) -> list[tuple[int, int, int]]:
    """The distinct (P, M, V) this library schedule is compared on."""
    _, fixed_v = TORCH_TWINS[name]
    cases = {(p, m, fixed_v or v) for v, m, p in TORCH_TEST_CASES}
    return sorted(cases)


def compute_step(cell: str) -> Step | None:
    """A torch cell as a compute step; None for an idle slot or REDUCE_GRAD."""
    if not cell or cell.endswith("REDUCE_GRAD"):
        return None
    return parse_step(cell.removesuffix(OVERLAP_SUFFIX))


def torch_programs(torch_class: str, ranks: int, microbatches: int, per_rank: int) -> tuple[tuple[Step, ...], ...]:
    """torch's compute order, rank by rank (raises what torch raises for a case it refuses)."""
    order = torch_pipeline_order(torch_class, ranks, microbatches, per_rank)
    return tuple(
        tuple(step for step in map(compute_step, order[rank]) if step is not None)
        for rank in range(ranks)
    )


def compute_programs(schedule: Schedule) -> tuple[tuple[Step, ...], ...]:
    return schedule.compute_only().programs


def torch_schedule(torch_class: str, ranks: int, microbatches: int, per_rank: int) -> Schedule:
    """torch's compute order as a pipeforge Schedule, to verify."""
    stages = ranks * per_rank
    v_shaped = torch_class in V_SCHEDULES
    placement = Placement.v(stages, ranks) if v_shaped else Placement.loop(stages, ranks)
    return Schedule(
        name=f"torch_{torch_class}",
        ranks=ranks,
        stages=stages,
        microbatches=microbatches,
        placements=(placement,),
        programs=torch_programs(torch_class, ranks, microbatches, per_rank),
    )
