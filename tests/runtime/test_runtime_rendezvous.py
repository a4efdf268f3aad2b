"""A rank late to a step's greeting, where no rank knew of a failure: no rank waits out the rendezvous.

Four ranks in a chain, the last one late (past its neighbour's greeting timeout)
before the second step. Its neighbour's greeting times out and it joins a fresh
group; the two ranks before it had greeted each other, step on in the old group
and fail there, and meet the others only at the next step. Before, the ranks met
under the names of two different steps, and every rank waited out the 60 s
rendezvous twice. Now a fresh group is named by how many each rank met in, and a
rank that meets ranks already at a later step fails its own step (naming them)
and steps on with them. On two ranks the late rank's greeting breaks too, both
meet at once and the step trains (gloo on 127.0.0.1, short timeouts).
"""

from __future__ import annotations

import pytest

import pipeforge
from pipeforge.generator import codegen
from pipeforge.tools.launch import spawn
from tests.load import scaled
from tests.runtime.rendezvous_jobs import late_steps

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(120)]

WAIT = scaled(1.5)  # every wait's bound in the pipeline (times the load)
LATE = 2 * WAIT  # how late the last rank is to the second step
FAST = scaled(5.0)  # what "at once" means here, under load; the rendezvous waits 60 s for a rank that never comes


@pytest.mark.parametrize("ranks", [2, 4])
def test_a_late_rank_costs_no_rank_the_rendezvous_timeout(tmp_path, ranks):
    path = str(codegen(pipeforge.load("1f1b", defines={"P": ranks, "M": 4}), tmp_path / "gen.py"))
    job = {"path": path, "wait": WAIT, "late": ranks - 1, "sleeps": [0, LATE, 0, 0]}
    outcomes = spawn(late_steps, ranks, job, timeout=scaled(20.0), deadline=60)
    assert all(o.ok for o in outcomes), "\n".join(o.error for o in outcomes if not o.ok)
    for outcome in outcomes:
        (first, _), (late, seconds), (after, next_seconds), (last, _) = outcome.value
        assert first == after == last == "", outcome.value  # the step after the late one trains
        assert seconds < LATE + FAST and next_seconds < LATE + FAST, outcome.value  # nobody waited 60 s
        if ranks == 2:
            assert late == "", outcome.value  # both greetings broke: the two met at once and the step trained
        elif outcome.rank >= ranks - 2:  # the late rank and its neighbour met the others behind them
            assert late.startswith(f"rank {outcome.rank}: its greeting with rank(s) "), outcome.value
            assert "rank(s) 0, 1 had ended this step failed already" in late, outcome.value
        else:  # their neighbour's connections closed in the old group
            assert late.startswith(f"rank {outcome.rank}: "), outcome.value
