"""A late rank, or a failure one rank alone knows of: no rank waits out the rendezvous, the next step trains.

Four ranks in a chain (and two), the last one late (past its neighbour's
timeout) before the second step. Its neighbour's wait for it times out, the
failure reaches every rank through the closed connections, and every rank meets
the others in a fresh group at the next step, which trains. Before, the ranks
met under the names of two different steps, and every rank waited out the 60 s
rendezvous twice. A fresh group is named by how many each rank met in, and a
rank that meets ranks already at a later step fails its own step (naming them)
and steps on with them. (While every step began with a greeting, the late step
trained on two ranks; a step now starts without one after an agreement that
every rank's step ran, and the late step fails on every rank.)

A failure one rank alone knows of: stage 0's last backward raises, which no
rank waits for. With the step-end agreement every rank raises it; without
(``end_agreement = False``), only rank 0 knows, and at the next step only its
neighbour hears it in the greeting: the ranks beyond step on in the old group.
Before, with four ranks, the two pairs met under different steps' names and
waited out the rendezvous (60 s, later 300 s) at every step after. Now the next
step fails at once on every rank and the one after trains (gloo on 127.0.0.1,
short timeouts).
"""

from __future__ import annotations

import pytest

import pipeforge
from pipeforge.generator import codegen
from pipeforge.tools.launch import spawn
from tests.load import scaled
from tests.runtime.rendezvous_jobs import last_backward_fails, late_steps

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
        assert late.startswith(f"rank {outcome.rank}: "), outcome.value  # the late step fails on every rank
        if outcome.rank == ranks - 2:  # the late rank's neighbour, whose wait for it timed out, names it
            assert f"with rank(s) {ranks - 1} failed" in late and "Timed out" in late, outcome.value


@pytest.mark.parametrize("ranks,agree", [(2, False), (4, False), (4, True)])
def test_a_failure_one_rank_knows_of_costs_no_rank_the_rendezvous_timeout(tmp_path, ranks, agree):
    path = str(codegen(pipeforge.load("1f1b", defines={"P": ranks, "M": 4}), tmp_path / "gen.py"))
    job = {"path": path, "wait": WAIT, "agree": agree, "steps": 4}
    outcomes = spawn(last_backward_fails, ranks, job, timeout=scaled(20.0), deadline=60)
    assert all(o.ok for o in outcomes), "\n".join(o.error for o in outcomes if not o.ok)
    for outcome in outcomes:
        (first, _), (failed, _), (after, seconds), (last, _) = outcome.value
        assert first == last == "", outcome.value  # the pipeline trains on
        assert seconds < FAST, outcome.value  # nobody waited out a timeout
        if outcome.rank == 0:
            assert failed == "rank 0: stage 0, microbatch 3, action 0B3: ValueError: a bad gradient", outcome.value
        elif agree:
            assert failed.startswith(f"rank {outcome.rank}: the step stopped because rank 0 failed at stage 0, "
                                     "microbatch 3, action 0B3"), outcome.value
        else:
            assert failed == "", outcome.value  # this rank's step ran, and without the agreement it was not told
        if agree or ranks == 2:
            assert after == "", outcome.value  # every rank knew: all met at the step's start
        else:  # the ranks beyond rank 0's neighbour learned at this step, which fails at once on every rank
            assert after.startswith(f"rank {outcome.rank}: "), outcome.value
