"""A step one rank refuses for its arguments reaches every rank at once, with that rank's message.

The checks of a call's arguments run before the step's greeting: a batch whose
shape changed since the first step, a missing target, a target or batch given
to a rank that does not use it, a target whose rows do not split like the
batch. Before, only the refusing rank raised and its peers waited out their
timeout. Now the refusing rank leaves its message on the store and refuses in
its greeting, and a rank further away learns when its neighbour closes its
connections: every other rank raises a ``PeerRefusedError`` (a
``PipelineUsageError``) naming the refusing rank and quoting its message, well
under the timeout, and the next step trains (gloo on 127.0.0.1, 2 and 4 ranks).
"""

from __future__ import annotations

import time

import pytest

import pipeforge
from pipeforge.generator import codegen
from pipeforge.tools.launch import spawn
from tests.demo_jobs import demo_pipeline, step_batch
from tests.load import scaled
from tests.runtime.agreement_jobs import one_rank_skips_the_agreement

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(300)]

WAIT = scaled(20.0)  # every wait's bound (times the load): a rank that was not told would fail only after it
FAST = WAIT / 4  # what "at once" means here, under load (measured: well under a second alone)

# case -> (the rank that refuses, what its message says)
CASES = {
    "shape": (0, "the batch changed shape since the first step"),
    "no-target": (-1, "step() needs target="),
    "rows": (-1, "target has 6 rows and the batch 8"),
    "stray-target": (0, "target= goes to the rank holding the last stage"),
    "stray-batch": (-1, "the batch goes to the rank holding stage 0"),
}


def refused_steps(rank: int, nproc: int, job: dict) -> list[dict]:
    """A good step, then for each case a step the victim calls wrongly and a good step again."""
    from pipeforge.runtime import PipelineUsageError
    from pipeforge.runtime.stage import PeerRefusedError
    from pipeforge.tools import demo_models as models

    pipe = demo_pipeline({**job, "wait": WAIT}, rank)
    x, y = models.make_batch(pipe.info.stages, 8, seed=0)

    def step(case: str | None) -> None:
        victim = case is not None and rank == CASES[case][0] % nproc
        batch = (x,) if pipe.holds_first else ()
        target = y if pipe.holds_last else None
        if victim and case == "shape":
            batch = (x[:6],)
        elif victim and case == "no-target":
            target = None
        elif victim and case == "rows":
            target = y[:6]
        elif victim and case == "stray-target":
            target = y
        elif victim and case == "stray-batch":
            batch = (x,)
        pipe.step(*batch, target=target)

    step(None)
    reports = []
    for case in job["cases"]:
        started = time.monotonic()
        report = {"case": case, "type": None, "error": None, "failed_rank": None}
        try:
            step(case)
        except PipelineUsageError as error:
            report.update(type=type(error).__name__, error=str(error), failed_rank=getattr(error, "failed_rank", None),
                          peer=isinstance(error, PeerRefusedError))
        report["seconds"] = time.monotonic() - started
        step(None)  # the next step trains (every rank met again in a fresh group)
        reports.append(report)
    return reports


@pytest.mark.parametrize("ranks,cases", [(2, sorted(CASES)), (4, ["shape", "no-target"])])
def test_a_refused_step_reaches_every_rank_at_once_with_its_message(tmp_path, ranks, cases):
    path = str(codegen(pipeforge.load("1f1b", defines={"P": ranks, "M": 4}), tmp_path / "gen.py"))
    outcomes = spawn(refused_steps, ranks, {"path": path, "cases": cases}, timeout=WAIT, deadline=240)
    assert all(o.ok for o in outcomes), "\n".join(o.error for o in outcomes if not o.ok)
    for index, case in enumerate(cases):
        victim, says = CASES[case][0] % ranks, CASES[case][1]
        own = outcomes[victim].value[index]
        assert own["type"] == "PipelineUsageError" and own["error"].startswith(f"rank {victim}"), own
        assert says in own["error"], own
        for outcome in outcomes:
            report = outcome.value[index]
            assert report["seconds"] < FAST, report  # nobody waited out the timeout
            if outcome.rank == victim:
                continue
            assert report["peer"] and report["failed_rank"] == victim, report
            quoted = own["error"].removeprefix(f"rank {victim}: ")
            assert report["error"].startswith(f"rank {outcome.rank}: rank {victim} refused this step: {quoted} "
                                              f"(this rank learned it here: rank {outcome.rank}: "), report


def keys_after_steps(rank: int, nproc: int, path: str) -> list[int]:
    """The default store's key count after 3 and after 13 steps (the step-end agreement adds none)."""
    import torch.distributed as dist

    from pipeforge.tools import demo_models as models

    pipe = demo_pipeline({"path": path, "wait": WAIT}, rank)
    x, y = models.make_batch(pipe.info.stages, 8, seed=0)
    counts = []
    for steps in (3, 10):
        for _ in range(steps):
            step_batch(pipe, x, y)
        dist.barrier()
        counts.append(dist.distributed_c10d._get_default_store().num_keys())
        dist.barrier()
    return counts


def test_the_step_end_agreement_leaves_no_keys_behind(tmp_path):
    path = str(codegen(pipeforge.load("1f1b", defines={"P": 2, "M": 4}), tmp_path / "gen.py"))
    outcomes = spawn(keys_after_steps, 2, path, timeout=WAIT, deadline=120)
    assert all(o.ok for o in outcomes), "\n".join(o.error for o in outcomes if not o.ok)
    early, late = outcomes[0].value
    assert late <= early, (early, late)  # no growth with the steps


@pytest.mark.parametrize("ranks,late", [(2, 1), (3, 0), (3, 2)])  # two ranks tell each other; three, through rank 0
def test_a_rank_that_sends_no_step_end_word_fails_the_others_step(tmp_path, ranks, late):
    path = str(codegen(pipeforge.load("1f1b", defines={"P": ranks, "M": 4}), tmp_path / "gen.py"))
    job = {"path": path, "late": late, "wait": scaled(2.0)}
    outcomes = spawn(one_rank_skips_the_agreement, ranks, job, timeout=WAIT, deadline=240)
    assert all(o.ok for o in outcomes), "\n".join(o.error for o in outcomes if not o.ok)
    for outcome in outcomes:
        first, second, third = outcome.value
        assert first == third == "", outcome.value  # the pipeline steps on after it
        if outcome.rank == late:
            assert second == "", outcome.value
        else:  # not a normal return: no rank learned whether the late rank's step failed
            assert second.startswith(f"rank {outcome.rank}: at the end of the step, "), outcome.value
            assert "word" in second, outcome.value
