"""Errors before the first step: ``Pipeline.check`` names rank, stage and inputs on every rank, none waits;
the first ``step()`` runs the same check before any compute.

And an exception inside a stage module during ``step()`` arrives naming rank,
stage, microbatch and action.
"""

from __future__ import annotations

import pytest

import pipeforge
from pipeforge.generator import codegen
from pipeforge.tools.launch import spawn
from tests.load import scaled

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(300)]

EXPECTED = {  # case -> what every rank's message says
    "model-output": ["stage 0 on rank 0", "BaseModelOutput with keys ['last_hidden_state']", "last_hidden_state"],
    "dict": ["stage 0 on rank 0", "dict with keys ['hidden']", "tensor or a tuple of tensors"],
    "h-none": ["stage 0 on rank 0", "(Tensor [2, 8] float64, None)", "return h"],
    "missing-argument": ["stage 1 on rank 1", "TypeError", "missing 1 required positional argument: 'mask'",
                         "1 positional input(s): Tensor [2, 8] float64"],
    "shape": ["stage 1 on rank 1", "RuntimeError", "Tensor [2, 8] float64"],
    "reentrant-split": ["stage 1 on rank 1", "reentrant activation checkpointing", "'zb_h1'", "use_reentrant=False"],
}
PASSING = ("good", "reentrant-1f1b", "checkpoint-split")


@pytest.fixture(scope="module", params=["run_checks", "run_first_steps"])
def checks(tmp_path_factory, request):
    """Every case through ``pipe.check`` (``run_checks``), and through ``pipe.step`` alone (``run_first_steps``:
    the first step checks before any compute, with the same messages)."""
    out = tmp_path_factory.mktemp("check")
    paths = {name: str(codegen(pipeforge.load(name, defines={"P": 2, "M": 2}), out / name))
             for name in ("1f1b", "zb-h1")}
    outcomes = spawn(f"tests.models.check_jobs:{request.param}", 2, paths, timeout=60, deadline=280)
    assert all(o.ok for o in outcomes), "\n".join(o.error for o in outcomes)
    return [o.value for o in outcomes]


@pytest.mark.parametrize("case", sorted(EXPECTED))
def test_check_names_the_problem_on_every_rank(checks, case):
    for rank, results in enumerate(checks):
        message = results[case]["message"]
        assert message is not None and message.startswith(f"rank {rank}: pipeline check: "), message
        for part in EXPECTED[case]:
            assert part in message, f"rank {rank}: {part!r} not in {message!r}"
        assert results[case]["seconds"] < scaled(20), "a rank waited for its peer"


@pytest.mark.parametrize("case", PASSING)
def test_check_passes_a_sound_pipeline(checks, case):
    assert all(results[case]["message"] is None for results in checks)


def test_an_exception_in_a_stage_module_names_rank_stage_microbatch_and_action(tmp_path):
    path = str(codegen(pipeforge.load("1f1b", defines={"P": 2, "M": 4}), tmp_path))
    outcomes = spawn("tests.models.check_jobs:run_step_error", 2, path, timeout=60, deadline=120)
    assert all(o.ok for o in outcomes), "\n".join(o.error for o in outcomes)
    message = outcomes[1].value
    assert message == ("StageError: rank 1: stage 1, microbatch 1, action 1F1: ZeroDivisionError: the expert count "
                       "is zero | cause ZeroDivisionError"), message
    told = outcomes[0].value  # rank 0 is told at once (tests/models/test_stage_errors.py), not at its timeout
    assert told.startswith("PeerStageError: rank 0: the step stopped because rank 1 failed at stage 1, microbatch 1, "
                           "action 1F1: ZeroDivisionError: the expert count is zero"), told
