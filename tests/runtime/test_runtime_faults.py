"""Failures end with a clear error within the configured timeout, never a silent hang."""

from __future__ import annotations

import os
import time

import pytest
import torch

import pipeforge
from pipeforge.generator import codegen
from pipeforge.tools.launch import spawn
from tests.demo_jobs import demo_pipeline, step_batch
from tests.load import scaled

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(120)]

WAIT = round(scaled(2.0), 1)  # seconds a rank waits for a hung peer (the hang test's limit), times the load
LONG_WAIT = scaled(60.0)  # a killed or failing peer is noticed by event (a closed connection): a bound only


class Sabotaged(torch.nn.Module):
    """Wraps a stage: on its ``when``-th forward it kills the process or sleeps; or from then on doubles its width."""

    def __init__(self, inner: torch.nn.Module, how: str, when: int):
        super().__init__()
        self.inner, self.how, self.when, self.calls = inner, how, when, 0

    def forward(self, x):
        self.calls += 1
        if self.calls == self.when and self.how == "kill":
            os._exit(7)
        if self.calls == self.when and self.how == "hang":
            time.sleep(3 * WAIT)
        y = self.inner(x)
        return torch.cat([y, y], dim=1) if self.how == "reshape" and self.calls >= self.when else y


def sabotaged_run(rank: int, nproc: int, payload: tuple) -> float:
    from pipeforge.tools import demo_models as models

    path, victim, how, when, wait = payload
    pipe = demo_pipeline({"path": path, "wait": wait}, rank,
                         lambda stage, module: Sabotaged(module, how, when) if rank == victim else module)
    pipe.preflight = False  # the fault is inside step(): no check's forward before it (it counts forwards)
    started = time.monotonic()
    for step in range(3):
        x, y = models.make_batch(pipe.info.stages, 2 * pipe.info.microbatches, seed=step)
        step_batch(pipe, x, y)
    return time.monotonic() - started


@pytest.fixture(scope="module")
def one_f_one_b(tmp_path_factory) -> str:
    return str(codegen(pipeforge.load("1f1b", defines={"P": 4, "M": 4}), tmp_path_factory.mktemp("gen")))


def run_sabotaged(path: str, victim: int, how: str, when: int):
    wait = WAIT if how == "hang" else LONG_WAIT
    started = time.monotonic()
    outcomes = spawn(sabotaged_run, 4, (path, victim, how, when, wait), timeout=wait, deadline=60)
    return outcomes, time.monotonic() - started


def test_a_peer_killed_mid_step_makes_the_others_fail_clearly(one_f_one_b):
    outcomes, seconds = run_sabotaged(one_f_one_b, victim=2, how="kill", when=3)
    assert not outcomes[2].ok and "exited with code 7" in outcomes[2].error
    survivors = [o for o in outcomes if o.rank != 2]
    assert all(not o.ok for o in survivors)
    for outcome in survivors:
        assert outcome.error.startswith("PipelineError: rank "), outcome.error
        assert "failed" in outcome.error and "peer rank may have died" in outcome.error
        assert "Connection" in outcome.error or "Timed out" in outcome.error
    assert seconds < scaled(30)


def test_a_hung_peer_times_out_within_the_configured_wait(one_f_one_b):
    outcomes, seconds = run_sabotaged(one_f_one_b, victim=1, how="hang", when=2)
    neighbours = [outcomes[0], outcomes[2]]
    for outcome in neighbours:
        assert not outcome.ok
        assert outcome.error.startswith("PipelineError: rank "), outcome.error
    assert any(f"waits limited to {WAIT:g} s" in o.error and "Timed out" in o.error for o in neighbours)
    assert seconds < scaled(30)


def test_an_activation_that_changes_shape_is_named(one_f_one_b):
    # stage 1's output doubles its width from its 5th forward on (step 1, microbatch 0)
    outcomes, seconds = run_sabotaged(one_f_one_b, victim=1, how="reshape", when=5)
    assert not outcomes[1].ok
    assert "changed shape since the first step" in outcomes[1].error
    assert all(not o.ok for o in outcomes)
    assert seconds < scaled(40)


def bad_modules(rank: int, nproc: int, path: str) -> str:
    import torch

    from pipeforge.tools.generated import load_module

    generated = load_module(path)
    try:
        generated.make_pipeline({7: torch.nn.Identity()})
    except Exception as error:  # noqa: BLE001
        return f"{type(error).__name__}: {error}"
    return "no error"


def test_stage_modules_that_do_not_fit_the_rank_are_refused(one_f_one_b):
    outcomes = spawn(bad_modules, 4, one_f_one_b, timeout=WAIT, deadline=60)
    assert outcomes[1].value == ("PipelineUsageError: rank 1 runs stages [1] of schedule 'one_f_one_b'; "
                                 "stage_modules has [7]")
