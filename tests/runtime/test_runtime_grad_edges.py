"""A received tensor wants a gradient only where its producer made it with one (learned with its shapes).

Stage 0 sends stage 1 its hidden state and a table made without a gradient (as
rotary tables ride along); stage 1 gets the table as a tensor that needs no
gradient (before: every float tensor received did) and training equals the
unpipelined model in float64. When the table starts carrying a gradient (its
scale made a parameter), the step says so instead of losing that gradient, and
the next step learns it anew and trains it (gloo on 127.0.0.1, 2 ranks).

A recomputed stage's forward runs without autograd, so what it sends (or hands
to the next stage on its rank) carries no gradient until its R; the stages of a
schedule that recomputes make every float input want a gradient, so a stage
after a recomputed one that is not recomputed itself still sends it its input
gradients (``pipeforge run`` on a 1F1B where stage 0 alone recomputes: reading
the flags there gives stage 0 no gradient).
"""

from __future__ import annotations

import pytest
import torch

import pipeforge
from pipeforge.cli import main
from pipeforge.generator import codegen
from pipeforge.tools.launch import spawn
from tests.load import scaled
from tests.runtime.table_jobs import MICROBATCHES, WIDTH, compared_step, two_stage_pipeline

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(300)]

WAIT = scaled(20.0)


class Head(torch.nn.Module):
    """A linear layer, sending on a table of its scale: a buffer (no gradient) or, once ``learn()``, a parameter."""

    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(WIDTH, WIDTH)
        self.register_buffer("fixed", torch.tensor(0.5))
        self.scale: torch.nn.Parameter | None = None

    def learn(self) -> None:
        self.scale = torch.nn.Parameter(self.fixed.clone())

    def forward(self, x):
        h = self.linear(x)
        return h, torch.ones_like(h.detach()) * (self.fixed if self.scale is None else self.scale)


class Tail(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(WIDTH, WIDTH)
        self.seen: list[tuple[bool, bool]] = []  # (hidden, table) requires_grad per forward

    def forward(self, h, table):
        self.seen.append((h.requires_grad, table.requires_grad))
        return torch.tanh(self.linear(h)) * table


def three_steps(rank: int, nproc: int, job: dict) -> dict:
    torch.set_default_dtype(torch.float64)
    torch.manual_seed(0)
    head, tail = Head(), Tail()
    mine, pipe, x, y = two_stage_pipeline(job, rank, head, tail)
    report: dict = {"errors": [], "diffs": []}
    for index in range(3):
        if index == 1:  # the table carries a gradient from now on, on both sides of the comparison
            head.learn()
            if rank == 0:
                mine.learn()
        compared_step(pipe, mine, rank, head, tail, x, y, report)
    report["seen"] = mine.seen if rank == 1 else []
    return report


def test_a_table_sent_without_a_gradient_is_received_without_one(tmp_path):
    path = str(codegen(pipeforge.load("1f1b", defines={"P": 2, "M": MICROBATCHES}), tmp_path / "gen.py"))
    outcomes = spawn(three_steps, 2, {"path": path, "wait": WAIT}, timeout=WAIT, deadline=240)
    assert all(o.ok for o in outcomes), "\n".join(o.error for o in outcomes if not o.ok)
    sender, receiver = (o.value for o in outcomes)
    for report in (sender, receiver):
        assert report["errors"][0] == report["errors"][2] == "", report["errors"]
        assert report["errors"][1], report["errors"]  # the step where the table began to carry a gradient
        assert max(report["diffs"]) <= 1e-12, report["diffs"]  # steps 1 and 3 equal the unpipelined model
    assert "carries a gradient now and did not at the first step" in sender["errors"][1], sender["errors"]
    # (the first forward is the first step's check, on zeros of the shapes)
    first, third = receiver["seen"][1:1 + MICROBATCHES], receiver["seen"][-MICROBATCHES:]
    assert first == [(True, False)] * MICROBATCHES, receiver["seen"]  # the table: no gradient wanted
    assert third == [(True, True)] * MICROBATCHES, receiver["seen"]  # learned anew: its gradient trains the scale


RECOMPUTE_FIRST = """
schedule recompute_first(P = 2, M = 4) {
    ranks P
    stages P placement loop
    microbatches M
    rank r {
        let warmup = min(M, P - 1 - r)
        for m in 0 .. warmup { F(r, m) }
        if r == 0 {
            for i in 0 .. M - warmup { F(r, warmup + i)  R(r, i)  B(r, i) }
            for i in M - warmup .. M { R(r, i)  B(r, i) }
        } else {
            for i in 0 .. M - warmup { F(r, warmup + i)  B(r, i) }
            for i in M - warmup .. M { B(r, i) }
        }
    }
}
"""


def test_a_stage_after_a_recomputed_one_sends_it_its_input_gradients(tmp_path, capsys):
    path = tmp_path / "recompute_first.pipe"
    path.write_text(RECOMPUTE_FIRST)
    assert main(["run", str(path), "--nproc", "2", "--json", "--timeout", str(int(WAIT))]) == 0, capsys.readouterr()
