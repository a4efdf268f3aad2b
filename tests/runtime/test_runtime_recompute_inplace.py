"""A stage that changes in place a tensor it receives without a gradient, after a recomputed stage.

Stage 0 sends stage 1 its hidden state and a table made without a gradient; stage 1 clamps or adds to
the table in place, then uses it. Under 1F1B, under 1F1B with stage 0 alone recomputed and with every
stage recomputed (``1f1b-recompute``), training equals the unpipelined model in float64 (gloo on
127.0.0.1, 2 ranks). With stage 0 recomputed, the table reaches stage 1 without a gradient, and when it
starts carrying one (its scale made a parameter) the step says so, as without recompute.
"""

from __future__ import annotations

import pytest

import pipeforge
from pipeforge.generator import codegen
from pipeforge.tools.launch import spawn
from tests.load import scaled
from tests.runtime.table_jobs import MICROBATCHES
from tests.runtime.test_runtime_grad_edges import RECOMPUTE_FIRST, three_steps

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(300)]

WAIT = scaled(20.0)


def _schedule(name: str):
    if name == "recompute-first":
        return pipeforge.loads(RECOMPUTE_FIRST)
    return pipeforge.load(name, defines={"P": 2, "M": 4})


@pytest.mark.parametrize("how", ["clamp_", "add_"])
@pytest.mark.parametrize("name", ["1f1b", "recompute-first", "1f1b-recompute"])
def test_a_table_changed_in_place_after_a_recomputed_stage_trains_as_unpipelined(tmp_path, name, how):
    path = str(codegen(_schedule(name), tmp_path / "gen.py"))
    outcomes = spawn("tests.runtime.recompute_inplace_jobs:two_steps", 2, {"path": path, "wait": WAIT, "how": how},
                     timeout=WAIT, deadline=240)
    assert all(o.ok for o in outcomes), "\n".join(o.error for o in outcomes if not o.ok)
    for rank, outcome in enumerate(outcomes):
        report = outcome.value
        assert report["errors"] == ["", ""], (rank, report["errors"])
        assert max(report["diffs"]) <= 1e-12, (rank, report["diffs"])


def test_a_recomputed_stage_announces_which_outputs_carry_a_gradient(tmp_path):
    path = tmp_path / "recompute_first.pipe"
    path.write_text(RECOMPUTE_FIRST)
    generated = str(codegen(pipeforge.load(str(path)), tmp_path / "gen.py"))
    outcomes = spawn(three_steps, 2, {"path": generated, "wait": WAIT}, timeout=WAIT, deadline=240)
    assert all(o.ok for o in outcomes), "\n".join(o.error for o in outcomes if not o.ok)
    sender, receiver = (o.value for o in outcomes)
    for report in (sender, receiver):
        assert report["errors"][0] == report["errors"][2] == "", report["errors"]
        assert max(report["diffs"]) <= 1e-12, report["diffs"]
    assert "carries a gradient now and did not at the first step" in sender["errors"][1], sender["errors"]
    first, third = receiver["seen"][1:1 + MICROBATCHES], receiver["seen"][-MICROBATCHES:]
    assert first == [(True, False)] * MICROBATCHES, receiver["seen"]  # before: (True, True), every float input
    assert third == [(True, True)] * MICROBATCHES, receiver["seen"]
