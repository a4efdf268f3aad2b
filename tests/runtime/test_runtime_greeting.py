"""A greeting that broke on one rank only: both ranks greet again in the fresh group, the step trains.

Where a rank's greeting times out while its neighbour's completes (the neighbour
arrived just at the deadline, or, with three ranks, the middle rank's wait for a
late third rank timed out after its exchange with the first completed), only the
rank whose greeting broke used to greet again in the fresh group; its neighbour,
reconnecting for a failure it knew of, sent its first activation's shapes header
there, which met the 16-byte greeting and gloo aborted the process ("Received
data size doesn't match expected size"). Now every rank that reconnects greets
again, on a tag no data uses (gloo on 127.0.0.1, three ranks, short timeouts).
Since a step after an agreed one starts without a greeting, here only the
late rank greets (it left the last agreement out): the others, knowing the
failure, close their connections and go to the meeting, where it joins them.
"""

from __future__ import annotations

import pytest

import pipeforge
from pipeforge.generator import codegen
from pipeforge.tools.launch import spawn
from tests.load import scaled
from tests.runtime.agreement_jobs import one_rank_skips_the_agreement

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(120)]

WAIT = scaled(1.5)  # every wait's bound in the pipeline (times the load)


def test_a_greeting_that_broke_on_one_side_is_greeted_again_on_both(tmp_path):
    path = str(codegen(pipeforge.load("1f1b", defines={"P": 3, "M": 3}), tmp_path / "gen.py"))
    # the last rank leaves step 1's agreement out, so the others end it failed and it does not; it then sleeps
    # past its neighbour's greeting timeout before step 2: the middle rank's greeting with the first rank
    # completes, its wait for the last times out
    job = {"path": path, "wait": WAIT, "late": 2, "sleep": 3 * WAIT}
    outcomes = spawn(one_rank_skips_the_agreement, 3, job, timeout=scaled(20.0), deadline=60)
    assert all(o.ok for o in outcomes), "\n".join(o.error for o in outcomes if not o.ok)
    for outcome in outcomes:
        first, unheard, late = outcome.value
        assert first == "", outcome.value
        assert late == "", outcome.value  # every rank met the others in the fresh group and the step trained
        if outcome.rank != 2:  # no word from the last rank (rank 0), or no answer from rank 0 in time (rank 1)
            assert unheard.startswith(f"rank {outcome.rank}: at the end of the step, "), outcome.value
