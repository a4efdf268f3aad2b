"""What exactly is wrong with torch 2.13's Schedule1F1B: its ``pipeline_order``, not its ``step()``.

``pipeline_order`` is what ``_dump_csv`` writes and what tools (pipeforge among
them) read; on the last rank it never forwards microbatch 0 and forwards a
microbatch M that does not exist. ``step()`` does not read it: its own loop
(``_step_microbatches``) runs F m / B m in a correct 1F1B order. Both are checked
here on torch's own code, the second by running ``_step_microbatches`` with a
stage that records what it is asked to compute and posts no communication.
"""

from __future__ import annotations

import pytest

from pipeforge.ir import ActionKind, Placement, Schedule, programs_from_tokens
from pipeforge.verifier import verify
from tests import torch_stages


class RecordingStage(torch_stages.StandInStage):
    """Records each F and B that torch's step loop asks of it; its sends and receives are empty."""

    def __init__(self, stage_index: int, num_stages: int):
        super().__init__(stage_index, num_stages, num_stages, stage_index)
        self.ran: list[str] = []

    def forward_one_chunk(self, fwd_chunk_id, *args, **kwargs):
        self.ran.append(f"{self.stage_index}F{fwd_chunk_id}")

    def backward_one_chunk(self, bwd_chunk_id, *args, **kwargs):
        self.ran.append(f"{self.stage_index}B{bwd_chunk_id}")

    def get_fwd_recv_ops(self, *args):
        return []

    get_fwd_send_ops = get_bwd_recv_ops = get_bwd_send_ops = get_fwd_recv_ops

    def perform_reduce_grad(self, *args):
        pass


def what_step_runs(ranks: int, microbatches: int) -> list[list[str]]:
    """Each rank's compute order as Schedule1F1B.step() runs it."""
    from torch.distributed.pipelining.schedules import Schedule1F1B

    orders = []
    for rank in range(ranks):
        stage = RecordingStage(rank, ranks)
        schedule = Schedule1F1B(stage, microbatches)
        schedule._check_inputs = lambda args, kwargs, targets, losses: ([()] * microbatches, [{}] * microbatches)
        schedule._initialize_stage = lambda *args: None
        schedule._maybe_compute_loss = lambda *args: None
        schedule._maybe_get_loss = lambda *args: None
        schedule._update_losses = lambda *args: None
        schedule._step_microbatches()
        orders.append(stage.ran)
    return orders


def as_schedule(rows: list[list[str]], ranks: int, microbatches: int) -> Schedule:
    return Schedule("torch_1f1b", ranks, ranks, microbatches, (Placement.loop(ranks, ranks),),
                    programs_from_tokens(rows))


@pytest.mark.parametrize("ranks, microbatches", [(2, 4), (4, 8), (4, 4)])
def test_pipeline_order_never_forwards_microbatch_0_on_the_last_rank(ranks, microbatches):
    order = torch_stages.torch_pipeline_order("Schedule1F1B", ranks, microbatches, 1)
    last = [cell for cell in order[ranks - 1] if cell]
    forwarded = {cell for cell in last if "F" in cell}
    assert f"{ranks - 1}F0" not in forwarded and f"{ranks - 1}F{microbatches}" in forwarded
    rows = [[cell or "_" for cell in order[rank]] for rank in range(ranks)]
    assert {"missing", "placement"} <= verify(as_schedule(rows, ranks, microbatches)).kinds()


@pytest.mark.parametrize("ranks, microbatches", [(2, 4), (4, 8), (4, 4)])
def test_what_step_runs_is_a_correct_1f1b(ranks, microbatches):
    runs = what_step_runs(ranks, microbatches)
    last = runs[ranks - 1]
    assert last == [f"{ranks - 1}{kind}{m}" for m in range(microbatches) for kind in "FB"]
    report = verify(as_schedule(runs, ranks, microbatches))
    assert report.valid, report.render()
    assert {a.kind for step in as_schedule(runs, ranks, microbatches).programs[0] for a in step.actions} == \
        {ActionKind.F, ActionKind.B}
