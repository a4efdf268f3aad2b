"""A rank failing at any point of a step: every rank raises promptly naming it, a later step trains.

Four gloo ranks on 127.0.0.1, 1F1B, short timeouts. A step starts without a
greeting where the last one's agreement heard every rank's step run, so the
failure reaches the others through the closed connections, the records on the
store and the step-end agreement alone: a stage that raises before it sends
anything or mid-step, a rank late past its neighbour's timeout, each fails that
step on every rank, well under the timeout, and the next step trains. A rank
that dies (its optimizer's error ends its process after a step, or it is killed
while its peers meet in a fresh group) is named by the survivors within
seconds: before, a rank at the meeting waited out its 60 s (the rendezvous
timed out); now the meeting looks for the missing ranks and whether their
processes are gone (the pipeline's liveness group, where only a closed
connection ends a receive), and where the dead rank hosted the store, the
store's loss is a ``PipelineError`` naming it too. A rank killed mid-step is named by every
survivor at that step (before, those beyond its neighbour named the neighbour whose connection
closed); one killed at the meeting after every rank came, before gloo's own rendezvous, is named
within seconds (before, the survivors waited out that rendezvous, at least 60 s).
"""

from __future__ import annotations

import re

import pytest

import pipeforge
from pipeforge.generator import codegen
from pipeforge.tools.launch import spawn
from tests.load import scaled
from tests.runtime.failure_jobs import failing_often, faulty_steps

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(180)]

WAIT = scaled(1.5)  # every wait's bound in the pipeline (times the load)
LATE = 2 * WAIT  # how late the late (and the dead) rank is to the second step
FAST = scaled(5.0)  # what "at once" means here, under load; the meeting waits 60 s for a rank that never comes
RANKS = 4


@pytest.fixture(scope="module")
def one_f_one_b(tmp_path_factory) -> str:
    return str(codegen(pipeforge.load("1f1b", defines={"P": RANKS, "M": 4}), tmp_path_factory.mktemp("gen")))


def _names_gone(error: str, victim: int) -> bool:
    """``error`` says rank ``victim`` is gone (among others: a survivor that ran its last step ends its
    process, and a slower one's meeting may find it gone too; where it hosted the store, the store with it)."""
    found = re.search(r"rank\(s\) ([\d, ]+) are gone", error)
    return found is not None and victim in [int(rank) for rank in found.group(1).split(", ")]


def run(path: str, fault: str, victim: int) -> list:
    job = {"path": path, "fault": fault, "victim": victim, "wait": WAIT, "late": LATE, "warm": scaled(20.0)}
    return spawn(faulty_steps, RANKS, job, timeout=scaled(20.0), deadline=60)


@pytest.mark.parametrize("fault,victim", [("first", 1), ("mid", 2), ("late", 3)])
def test_a_failed_step_reaches_every_rank_at_once_and_the_next_trains(one_f_one_b, fault, victim):
    outcomes = run(one_f_one_b, fault, victim)
    assert all(o.ok for o in outcomes), "\n".join(o.error for o in outcomes if not o.ok)
    for outcome in outcomes:
        (first, _), (failed, seconds), (after, _), (last, _) = outcome.value
        assert first == after == last == "", outcome.value  # the steps after the failed one train
        assert failed.startswith(f"rank {outcome.rank}: "), outcome.value  # no rank returned normally
        assert seconds < (LATE if fault == "late" else 0) + FAST, outcome.value  # nobody waited out a timeout
        if fault == "late":
            continue
        if outcome.rank == victim:
            assert failed.startswith(f"rank {victim}: stage {victim}, microbatch "), outcome.value
            assert "ValueError: a bad batch" in failed, outcome.value
        else:  # the failing rank's error, named
            assert failed.startswith(f"rank {outcome.rank}: the step stopped because rank {victim} failed at "
                                     f"stage {victim}, microbatch "), outcome.value
    if fault == "late":  # the late rank's neighbour, whose wait for it timed out, names it
        failed = outcomes[victim - 1].value[1][0]
        assert f"with rank(s) {victim} failed" in failed and "Timed out" in failed, failed


@pytest.mark.parametrize("fault,victim", [("optimizer", 1), ("dead", 3), ("dead", 0), ("killed", 3),
                                         ("reconnect", 3)])  # rank 0 hosts the store
def test_a_rank_that_dies_is_named_by_every_survivor_within_seconds(one_f_one_b, fault, victim):
    outcomes = run(one_f_one_b, fault, victim)
    assert not outcomes[victim].ok, outcomes[victim]
    if fault == "optimizer":
        assert "the optimizer failed" in outcomes[victim].error, outcomes[victim].error
    for outcome in outcomes:
        if outcome.rank == victim:
            continue
        assert outcome.ok, outcome.error
        (first, _), (during, during_seconds), (after, after_seconds), (last, last_seconds) = outcome.value
        assert first == "", outcome.value
        if fault == "optimizer":  # its step ran: the survivors learn at the next one, which fails at once
            assert during == "" and after.startswith(f"rank {outcome.rank}: "), outcome.value
            assert after_seconds < FAST, outcome.value
        elif fault == "reconnect":  # it failed its step, and died at the next one's meeting, before gloo's rendezvous
            assert during.startswith(f"rank {outcome.rank}: the step stopped because rank {victim} failed at stage "
                                     f"{victim}"), outcome.value
            assert _names_gone(after, victim) and after_seconds < FAST, outcome.value
        elif fault == "killed":  # every survivor names the rank that died, not the neighbour that closed on it
            assert during.startswith(f"rank {outcome.rank}: the step stopped because rank {victim} failed: its "
                                     f"process is gone (it held stage(s) {victim}; rank "), outcome.value
            assert during_seconds < FAST, outcome.value
            assert _names_gone(after, victim) and after_seconds < FAST, outcome.value
        else:  # the survivors meet at the step after the late one, where it dies
            assert during.startswith(f"rank {outcome.rank}: ") and during_seconds < LATE + FAST, outcome.value
            assert _names_gone(after, victim) and after_seconds < LATE + FAST, outcome.value
        assert _names_gone(last, victim) and last_seconds < FAST, outcome.value  # not the 60 s meeting


def test_a_pipeline_failing_step_after_step_holds_no_more_threads_or_store_keys(one_f_one_b):
    """Every failed step's ranks meet in fresh gloo groups (three, with their threads and connections), and
    leave keys on the store: before, each meeting kept 7 more threads alive on every rank and 16 more keys on
    the store (12 steps: 14 threads to 49, 21 keys to 107); now the groups two meetings old go, with the
    probes and what was abandoned on them, and each rank forgets its keys of the meetings before the last."""
    steps = 14
    job = {"path": one_f_one_b, "wait": scaled(20.0), "steps": steps}
    outcomes = spawn(failing_often, RANKS, job, timeout=scaled(20.0), deadline=120)
    assert all(o.ok for o in outcomes), "\n".join(o.error for o in outcomes if not o.ok)
    for outcome in outcomes:
        seen = outcome.value
        assert [failed for failed, _, _ in seen] == [index % 2 == 1 for index in range(steps)], seen
        threads, keys = (max(row[column] for row in seen[2:6]) for column in (1, 2))  # two meetings in: what stays
        _, last_threads, last_keys = seen[-1]  # five meetings later (each kept 7 threads and 16 keys more before)
        assert last_threads <= threads + 4 and last_keys <= keys + 4, seen
