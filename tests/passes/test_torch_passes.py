"""The four passes against torch 2.13's own, on torch's schedules: the same action lists.

For every torch schedule that lowers its order with these passes (the
``_PipelineScheduleRuntime`` family) and every case of torch's tests up to 8
ranks and 32 microbatches: ``unshard`` against ``_add_unshard_reshard`` (K = 1..4),
``reduce_grad`` against ``_add_reduce_grad``, ``merge_bw`` against ``_merge_bw``,
and ``defer_recv`` against ``_defer_recv_ops`` on torch's own lowered order
(``_add_send_recv``'s output, read into the IR one action a step), wherever
torch's result keeps each send paired with its own receive.

torch reshards what is still gathered at the end of a rank in the order of a
Python set, ``unshard`` in stage order: the same on every case here.
"""

from __future__ import annotations

from functools import cache

import pytest
from torch.distributed.pipelining import schedules as ts

from pipeforge.interop.torch_csv import read_csv_text
from pipeforge.ir import Schedule
from pipeforge.passes import PassOptions, apply_passes, defer_recv, merge_bw, reduce_grad, unshard
from pipeforge.verifier import verify
from tests.library.torch_orders import TORCH_TEST_CASES, torch_schedule
from tests.torch_stages import build_torch_schedule

RUNTIME = ("ScheduleLoopedBFS", "ScheduleInterleaved1F1B", "ScheduleInterleavedZeroBubble",
           "ScheduleZBVZeroBubble", "ScheduleDualPipeV")
SPLIT_BACKWARD = ("ScheduleInterleavedZeroBubble", "ScheduleZBVZeroBubble", "ScheduleDualPipeV")
FIXED_V = {"ScheduleZBVZeroBubble": 2, "ScheduleDualPipeV": 2}


def cases(classes):
    found = set()
    for per_rank, microbatches, ranks in TORCH_TEST_CASES:
        if ranks <= 8 and microbatches <= 32:
            for name in classes:
                found.add((name, ranks, microbatches, FIXED_V.get(name, per_rank)))
    return sorted(found)


def torch_or_skip(name: str, ranks: int, microbatches: int, per_rank: int):
    built = torch_built(name, ranks, microbatches, per_rank)
    if isinstance(built, str):
        pytest.skip(f"torch {name} refuses P={ranks} M={microbatches} V={per_rank}: {built}")
    return built


@cache
def torch_built(name: str, ranks: int, microbatches: int, per_rank: int):
    """torch's schedule object (built once per case: building is the slow part), or why torch refuses."""
    try:
        return build_torch_schedule(name, ranks, microbatches, per_rank)
    except (ValueError, AssertionError) as refused:
        return str(refused)


def cells(actions) -> list[str]:
    """torch's actions as the step text pipeforge writes (an overlap without torch's suffix)."""
    return [str(action).removesuffix("OVERLAP_F_B") for action in actions if action is not None]


def ours(schedule: Schedule, rank: int) -> list[str]:
    return [str(step) for step in schedule.programs[rank] if not step.is_idle]


def assert_same_orders(mine: Schedule, torch_sched, torch_pass) -> None:
    """Every rank's steps of ``mine`` equal ``torch_pass`` applied to torch's order of that rank."""
    for rank, order in torch_sched.pipeline_order.items():
        assert ours(mine, rank) == cells(torch_pass(list(order))), f"rank {rank}"


@pytest.mark.parametrize("bound", [1, 2, 3, 4])
@pytest.mark.parametrize("name, ranks, microbatches, per_rank", cases(RUNTIME))
def test_unshard_equals_torch(name, ranks, microbatches, per_rank, bound):
    torch_sched = torch_or_skip(name, ranks, microbatches, per_rank)
    mine = unshard(torch_schedule(name, ranks, microbatches, per_rank), bound)
    assert_same_orders(mine, torch_sched, lambda order: ts._add_unshard_reshard(order, bound))


@pytest.mark.parametrize("name, ranks, microbatches, per_rank", cases(RUNTIME))
def test_reduce_grad_equals_torch(name, ranks, microbatches, per_rank):
    torch_sched = torch_or_skip(name, ranks, microbatches, per_rank)
    mine = reduce_grad(torch_schedule(name, ranks, microbatches, per_rank))
    assert_same_orders(mine, torch_sched, lambda order: ts._add_reduce_grad(order, microbatches))


@pytest.mark.parametrize("name, ranks, microbatches, per_rank", cases(SPLIT_BACKWARD))
def test_merge_bw_equals_torch(name, ranks, microbatches, per_rank):
    torch_sched = torch_or_skip(name, ranks, microbatches, per_rank)
    mine = merge_bw(torch_schedule(name, ranks, microbatches, per_rank))
    assert_same_orders(mine, torch_sched, ts._merge_bw)
    if name == "ScheduleZBVZeroBubble":  # its steady state runs I then W of one microbatch back to back
        assert any(step.actions[0].kind.value == "B" for _, _, step in mine.steps() if step.actions)


@pytest.mark.parametrize("name, ranks, microbatches, per_rank", cases(RUNTIME))
def test_defer_recv_equals_torch_where_torch_keeps_the_pairing(name, ranks, microbatches, per_rank):
    """Equal to torch where torch's output pairs every send with its receive; where torch's pairs a
    send with another tensor's receive (it defers receives from one rank out of their order: on
    the V and zero-bubble schedules), ours keeps the pairing and is valid."""
    torch_sched = torch_or_skip(name, ranks, microbatches, per_rank)
    lowered = torch_sched.pipeline_order_with_comms
    stages = ranks * per_rank
    mine = defer_recv(as_schedule(lowered, ranks, stages, microbatches))
    theirs = ts._defer_recv_ops(lowered, stage_to_rank=lambda s: torch_sched.stage_index_to_group_rank[s])
    torch_report = verify(as_schedule(theirs, ranks, stages, microbatches), semantics="buffered")
    assert verify(mine, semantics="buffered").valid
    if torch_report.valid:
        for rank in range(ranks):
            assert ours(mine, rank) == cells(theirs[rank]), f"rank {rank}"
    else:
        assert torch_report.kinds() == {"mismatch"}, torch_report.render()


def as_schedule(order: dict[int, list], ranks: int, stages: int, microbatches: int) -> Schedule:
    text = "".join(",".join(str(action) for action in order[rank]) + "\n" for rank in range(ranks))
    return read_csv_text(text, "torch.csv", stages=stages, microbatches=microbatches)


@pytest.mark.parametrize("name, ranks, microbatches, per_rank", cases(RUNTIME))
def test_lowering_with_unshard_3_equals_torchs_runtime_order_up_to_communication(name, ranks, microbatches, per_rank):
    """torch's _PipelineScheduleRuntime always runs unshard (K = 3) and reduce_grad before adding
    sends and receives; ``apply_passes(unshard=3, lower=True)`` gives the same order of compute and
    stage-only actions on every rank (the two lowerings post communication differently)."""
    torch_sched = torch_or_skip(name, ranks, microbatches, per_rank)
    mine = apply_passes(torch_schedule(name, ranks, microbatches, per_rank), PassOptions(unshard=3), lower=True)
    for rank in range(ranks):
        theirs = [cell for cell in cells(torch_sched.pipeline_order_with_comms[rank]) if "SEND" not in cell
                  and "RECV" not in cell]
        assert [step for step in ours(mine, rank) if "SEND" not in step and "RECV" not in step] == theirs, \
            f"rank {rank}"
