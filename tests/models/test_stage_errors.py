"""A stage that raises inside ``step()``: the failing rank raises the ``StageError``, every peer a
``PeerStageError`` naming the failing rank, stage, microbatch and action, within moments and not at its
timeout; then every rank steps on and trains like the unpipelined model (gloo, float64).

Before, the peers learned only "Connection closed by peer" (or, before the pipeline closed its
connections on a failure, waited out their timeout).
"""

from __future__ import annotations

import pytest

import pipeforge
from pipeforge.generator import codegen
from pipeforge.tools.launch import spawn

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(300)]

WAIT = 60.0  # every wait's bound: a peer that was not told would fail only after it
TOLD_WITHIN = 5.0  # seconds from the raise to a peer's error (measured: well under 1 s alone)


@pytest.mark.parametrize("ranks,victim,kind,mb,finish", [
    (2, 1, "F", 2, ()),   # the last rank's forward: rank 0 waits for a gradient
    (2, 1, "B", 1, ()),   # the last rank's backward
    (3, 1, "F", 1, ()),   # the middle rank: both neighbours told
    (4, 1, "F", 2, ()),   # rank 3 does not neighbour rank 1: it learns when rank 2 closes its connections
    (4, 2, "B", 1, ()),
    # rank 1's backward of microbatch 2 comes after its last forward: rank 3 needs nothing more from the
    # ranks before it and ends its step normally; it learns at the next step's start (which recovers)
    (4, 1, "B", 2, (3,)),
])
def test_every_peer_is_told_which_stage_failed_and_the_pipeline_steps_on(tmp_path, ranks, victim, kind, mb, finish):
    path = str(codegen(pipeforge.load("1f1b", defines={"P": ranks, "M": 4}), tmp_path / "gen.py"))
    job = {"path": path, "victim": victim, "kind": kind, "mb": mb, "wait": WAIT}
    outcomes = spawn("tests.models.stage_error_jobs:fail_then_step", ranks, job, timeout=WAIT, deadline=240)
    assert all(o.ok for o in outcomes), "\n".join(o.error for o in outcomes if not o.ok)
    reports = [o.value for o in outcomes]
    action = f"{victim}{kind}{mb}"
    failing = reports[victim]
    original = "a bad batch" if kind == "F" else "a bad gradient"
    assert failing["type"] == "StageError", failing
    assert failing["error"].startswith(f"rank {victim}: stage {victim}, microbatch {mb}, action {action}: "
                                       f"ValueError: {original}"), failing
    for report in reports:
        rank = report["rank"]
        assert report["max_abs_diff"] <= 1e-12, report  # the steps after it train like the unpipelined model
        if rank in finish:
            assert report["error"] is None, report
            continue
        assert report["seconds"] < WAIT / 4, report  # the whole failed step: nobody waited out a timeout
        if rank == victim:
            continue
        assert report["type"] == "PeerStageError", report
        assert report["error"].startswith(f"rank {rank}: the step stopped because rank {victim} failed at stage "
                                          f"{victim}, microbatch {mb}, action {action}: ValueError: {original} "
                                          f"(this rank learned it here: rank {rank}: "), report
        assert report["fields"] == {"failed_rank": victim, "stage": victim, "microbatch": mb, "action": action}
        assert report["cause"] == "PipelineError", report  # this rank's own wait, as before
        assert report["caught_at"] - failing["raised_at"] < TOLD_WITHIN, (report, failing)
