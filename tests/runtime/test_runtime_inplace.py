"""Stages that change a tensor in place train as the unpipelined model does (float64, gloo on 127.0.0.1).

Stage 0 doubling its input in place: the first step's check (``preflight``) ran stage 0 on the user's
first microbatch itself, so the batch left that step with microbatch 0 doubled twice, and the second step
trained on it (before: the batch 2x off, gradients off by more than 1e-2); it now runs on a copy. A later
stage whose first operation changes in place the activation it receives (``add_``, ``ReLU(inplace=True)``),
which carries a gradient: the received tensor is a leaf wanting one, which torch lets no operation change
in place, so the step failed at its first forward (before: "a leaf Variable that requires grad is being
used in an in-place operation"); the stage is now given a copy where it changes its input (learned at its
first forward). Under 1F1B on three ranks (a middle stage, a last stage) and ZB-V on two (split backward,
a stage handing over to the next on its rank).
"""

from __future__ import annotations

import pytest

import pipeforge
from pipeforge.generator import codegen
from pipeforge.tools.launch import spawn
from tests.load import scaled

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(300)]

WAIT = scaled(20.0)


def _run(tmp_path, name: str, ranks: int, hows: list[str]) -> list[dict]:
    defines = {"P": ranks, "M": 4}
    path = str(codegen(pipeforge.load(name, defines=defines), tmp_path / "gen.py"))
    job = {"path": path, "wait": WAIT, "hows": hows, "steps": 2}
    outcomes = spawn("tests.runtime.inplace_jobs:compared_steps", ranks, job, timeout=WAIT, deadline=240)
    assert all(o.ok for o in outcomes), "\n".join(o.error for o in outcomes if not o.ok)
    return [o.value for o in outcomes]


def test_the_check_leaves_a_batch_that_stage_0_changes_in_place_as_unpipelined_training_does(tmp_path):
    reports = _run(tmp_path, "1f1b", 2, ["mul_", "none"])
    for report in reports:
        assert report["errors"] == ["", ""], report["errors"]
        assert max(report["diffs"]) <= 1e-12, report["diffs"]
    assert reports[0]["batch"] == [0.0, 0.0], reports[0]["batch"]  # the batch is changed once a step, as unpipelined


@pytest.mark.parametrize("how", ["add_", "relu"])
@pytest.mark.parametrize("name,ranks,hows", [("1f1b", 3, ["none", "{how}", "{how}"]),
                                             ("zbv", 2, ["none", "{how}", "{how}", "none"])])
def test_a_stage_changing_a_received_activation_in_place_trains_as_unpipelined(tmp_path, name, ranks, hows, how):
    reports = _run(tmp_path, name, ranks, [h.format(how=how) for h in hows])
    for report in reports:
        assert report["errors"] == ["", ""], report["errors"]
        assert max(report["diffs"]) <= 1e-12, report["diffs"]
