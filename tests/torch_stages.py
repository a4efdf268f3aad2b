"""torch schedules built without a process group, for comparing with torch's own orders.

torch's schedules read only a few attributes of their stages while computing the
pipeline order (stage_index, num_stages, group_size, group_rank, submod), so a
``_PipelineStageBase`` subclass that skips ``__init__`` and sets those is enough.
Used by the interop, library and benchmark code (import it as ``tests.torch_stages``
or put ``tests`` on the path).
"""

from __future__ import annotations

import csv
from pathlib import Path

import torch
from torch.distributed.pipelining import schedules as torch_schedules
from torch.distributed.pipelining._utils import generate_stage_to_rank_mapping
from torch.distributed.pipelining.stage import _PipelineStageBase

V_SCHEDULES = ("ScheduleZBVZeroBubble", "ScheduleDualPipeV")


class StandInStage(_PipelineStageBase):
    """A stage that holds only what a schedule reads while building its order."""

    def __init__(self, stage_index: int, num_stages: int, group_size: int, group_rank: int):
        # _PipelineStageBase.__init__ would query torch.distributed; set its attributes instead.
        self.stage_index = stage_index
        self.num_stages = num_stages
        self.group_size = group_size
        self.group_rank = group_rank
        self.submod = torch.nn.Identity()
        self.stage_index_to_group_rank = {}

    def _create_grad_recv_info(self, *args, **kwargs):
        raise NotImplementedError("a stand-in stage does not run")

    def _prepare_backward_infra(self, *args, **kwargs):
        raise NotImplementedError("a stand-in stage does not run")

    def _prepare_forward_infra(self, *args, **kwargs):
        raise NotImplementedError("a stand-in stage does not run")


def schedule_class_of(schedule_class):
    return getattr(torch_schedules, schedule_class) if isinstance(schedule_class, str) else schedule_class


def build_torch_schedule(schedule_class, n_ranks: int, n_microbatches: int, stages_per_rank: int = 1, rank: int = 0):
    """The torch schedule object as rank ``rank`` would build it (it holds every rank's order)."""
    cls = schedule_class_of(schedule_class)
    n_stages = n_ranks * stages_per_rank
    style = "v" if cls.__name__ in V_SCHEDULES else "loop"
    mapping = generate_stage_to_rank_mapping(n_ranks, n_stages, style=style)
    stages = [StandInStage(s, n_stages, n_ranks, rank) for s in range(n_stages) if mapping[s] == rank]
    if issubclass(cls, torch_schedules.PipelineScheduleSingle):
        if stages_per_rank != 1:
            raise ValueError(f"{cls.__name__} runs one stage per rank")
        return cls(stages[0], n_microbatches)
    return cls(stages, n_microbatches)


def cells(order: dict[int, list]) -> dict[int, list[str]]:
    """torch's actions as the strings its CSV holds ('' for an idle None)."""
    return {rank: ["" if action is None else str(action) for action in actions] for rank, actions in order.items()}


def torch_pipeline_order(schedule_class, n_ranks: int, n_microbatches: int, stages_per_rank: int = 1) -> dict[int, list[str]]:
    """The compute-only order torch builds: rank -> action strings ('' = idle)."""
    schedule = build_torch_schedule(schedule_class, n_ranks, n_microbatches, stages_per_rank)
    return cells(schedule.pipeline_order)


def torch_pipeline_order_with_comms(schedule_class, n_ranks: int, n_microbatches: int,
                                    stages_per_rank: int = 1) -> dict[int, list[str]]:
    """The lowered order torch's runtime executes (sends, receives, REDUCE_GRAD, UNSHARD/RESHARD)."""
    schedule = build_torch_schedule(schedule_class, n_ranks, n_microbatches, stages_per_rank)
    if not hasattr(schedule, "pipeline_order_with_comms"):
        raise ValueError(f"{type(schedule).__name__} has no lowered order (a single-stage schedule)")
    return cells(schedule.pipeline_order_with_comms)


def dump_torch_csv(schedule_class, n_ranks: int, n_microbatches: int, stages_per_rank: int, path: str | Path,
                   format: str = "compute_only") -> Path:
    """Write the CSV with torch's own ``_dump_csv`` and return its path."""
    schedule = build_torch_schedule(schedule_class, n_ranks, n_microbatches, stages_per_rank)
    if isinstance(schedule, torch_schedules._PipelineScheduleRuntime):
        schedule._dump_csv(str(path), format=format)
    elif isinstance(schedule, torch_schedules.PipelineScheduleMulti):
        schedule._dump_csv(str(path))
    else:  # single-stage schedules have no _dump_csv; write what its Multi twin would
        with open(path, "w", newline="") as file:
            writer = csv.writer(file)
            for rank in schedule.pipeline_order:
                writer.writerow(schedule.pipeline_order[rank])
    return Path(path)


def read_cells(path: str | Path) -> list[list[str]]:
    with open(path, newline="") as file:
        return list(csv.reader(file))


def torch_lowered_cells(compute_cells: dict[int, list[str]], stage_to_rank: dict[int, int], n_microbatches: int,
                        max_active_stages: int | None = 3, reduce_grad: bool = True) -> dict[int, list[str]]:
    """A compute-only order lowered by torch's own passes, as ``_prepare_schedule_with_comms`` does:
    UNSHARD/RESHARD (``_add_unshard_reshard``, left out when ``max_active_stages`` is None),
    REDUCE_GRAD (``_add_reduce_grad``), then sends and receives (``_add_send_recv``)."""
    order: dict[int, list] = {}
    for rank, row in compute_cells.items():
        actions = [torch_schedules._Action.from_str(cell) if cell else None for cell in row]
        if max_active_stages is not None:
            actions = torch_schedules._add_unshard_reshard(actions, max_active_stages)
        else:
            actions = [a for a in actions if a is not None]
        if reduce_grad:
            actions = torch_schedules._add_reduce_grad(actions, n_microbatches)
        order[rank] = actions
    lowered = torch_schedules._add_send_recv(order, stage_to_rank=lambda s: stage_to_rank[s],
                                             num_stages=len(stage_to_rank))
    return cells(lowered)


def csv_text(order: dict[int, list[str]]) -> str:
    """Rows of cells as torch's ``_dump_csv`` writes them."""
    import io

    out = io.StringIO()
    writer = csv.writer(out)
    for rank in sorted(order):
        writer.writerow(order[rank])
    return out.getvalue()
