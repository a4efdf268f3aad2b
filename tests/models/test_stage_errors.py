"""A stage that raises inside ``step()``: the failing rank raises the ``StageError``, every peer a
``PeerStageError`` naming the failing rank, stage, microbatch and action, within moments and not at its
timeout (a rank whose step ran to its end too, at the step-end agreement); then every rank steps on and
trains like the unpipelined model (gloo, float64).

Before, the peers learned only "Connection closed by peer" (or, before the pipeline closed its
connections on a failure, waited out their timeout).
"""

from __future__ import annotations

import pytest

import pipeforge
from pipeforge.generator import codegen
from pipeforge.tools.launch import spawn
from tests.load import scaled

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(300)]

WAIT = scaled(60.0)  # every wait's bound (times the load): a peer that was not told would fail only after it
TOLD_WITHIN = 5.0  # seconds from the raise to a peer's error (measured: well under 1 s alone)


@pytest.mark.parametrize("schedule,ranks,victim,stage,kind,mb,finish,call", [
    ("1f1b", 2, 1, 1, "F", 2, (), "step"),   # the last rank's forward: rank 0 waits for a gradient
    ("1f1b", 2, 1, 1, "B", 1, (), "step"),   # the last rank's backward
    ("1f1b", 3, 1, 1, "F", 1, (), "step"),   # the middle rank: both neighbours told
    ("1f1b", 4, 1, 1, "F", 2, (), "step"),   # rank 3 does not neighbour rank 1: told when rank 2 closes its own
    ("1f1b", 4, 2, 2, "B", 1, (), "step"),
    # rank 1's backward of microbatch 2 comes after its last forward: rank 3 needs nothing more from the
    # ranks before it and runs its step to its end; it learns at the step-end agreement, not at the next step
    ("1f1b", 4, 1, 1, "B", 2, (3,), "step"),
    # rank 0's last backward: rank 1 ran its whole program already and learns at the step-end agreement
    ("1f1b", 2, 0, 0, "B", 3, (1,), "step"),
    ("zb-h1", 2, 1, 1, "I", 1, (), "step"),  # a split backward: the input half raises
    ("interleaved-1f1b", 2, 0, 2, "F", 1, (), "step"),  # the second stage of rank 0
    ("1f1b", 3, 1, 1, "F", 1, (), "eval"),
])
def test_every_peer_is_told_which_stage_failed_and_the_pipeline_steps_on(tmp_path, schedule, ranks, victim, stage,
                                                                         kind, mb, finish, call):
    path = str(codegen(pipeforge.load(schedule, defines={"P": ranks, "M": 4}), tmp_path / "gen.py"))
    job = {"path": path, "victim": victim, "stage": stage, "kind": kind, "mb": mb, "wait": WAIT,
           "eval": call == "eval"}
    outcomes = spawn("tests.models.stage_error_jobs:fail_then_step", ranks, job, timeout=WAIT, deadline=240)
    assert all(o.ok for o in outcomes), "\n".join(o.error for o in outcomes if not o.ok)
    reports = [o.value for o in outcomes]
    action = f"{stage}{kind}{mb}"
    failing = reports[victim]
    original = "a bad batch" if kind == "F" else "a bad gradient"
    assert failing["type"] == "StageError", failing
    assert failing["error"].startswith(f"rank {victim}: stage {stage}, microbatch {mb}, action {action}: "
                                       f"ValueError: {original}"), failing
    for report in reports:
        rank = report["rank"]
        assert report["max_abs_diff"] <= 1e-12, report  # the steps after it train like the unpipelined model
        assert report["seconds"] < WAIT / 4, report  # the whole failed step: nobody waited out a timeout
        if rank == victim:
            continue
        assert report["type"] == "PeerStageError", report
        assert report["error"].startswith(f"rank {rank}: the step stopped because rank {victim} failed at stage "
                                          f"{stage}, microbatch {mb}, action {action}: ValueError: {original} "
                                          f"(this rank learned it here: rank {rank}: "), report
        assert report["fields"] == {"failed_rank": victim, "stage": stage, "microbatch": mb, "action": action}
        assert report["cause"] == "PipelineError", report  # this rank's own wait, as before
        assert report["caught_at"] - failing["raised_at"] < TOLD_WITHIN, (report, failing)
        if rank in finish:  # its step ran to its end: the step-end agreement told it
            assert f"(this rank learned it here: rank {rank}: the end of its step, which ran to its end)" in \
                report["error"], report
