"""A recomputed stage given no tensor input to keep is refused on every rank, naming rank, stage, argument
and the R's place; nothing is computed, and the next call is refused the same way (runtime/saved.py)."""

from __future__ import annotations

import pytest
import torch

import pipeforge
from pipeforge.generator import codegen
from pipeforge.runtime import PipelineUsageError
from pipeforge.runtime.saved import SavedActivations
from pipeforge.runtime.stage import StageRunner
from pipeforge.tools.launch import spawn
from tests.runtime.unkept_jobs import WAIT


@pytest.mark.distributed
@pytest.mark.timeout(300)
def test_every_rank_refuses_a_recomputed_stage_with_nothing_to_keep(tmp_path):
    path = str(codegen(pipeforge.load("1f1b-recompute", defines={"P": 3, "M": 3}), tmp_path / "gen"))
    outcomes = spawn("tests.runtime.unkept_jobs:refused", 3, path, timeout=WAIT, deadline=200)
    assert all(o.ok for o in outcomes), "\n".join(o.error for o in outcomes if not o.ok)
    own = ("stage 0 is recomputed (its R of microbatch 0 at 1f1b-recompute.pipe:12:54) but its forward is "
           "given no tensor input to keep: argument 0 (int).")
    for rank, outcome in enumerate(outcomes):
        found = outcome.value
        assert found["untouched"], rank
        for call in ("check", "step", "step again"):  # the preflight (automatic at the first step): every rank
            assert found[call].startswith(f"rank {rank}: pipeline check: rank 0: {own}"), (rank, found[call])
        for call in ("step, no preflight", "step again, no preflight"):  # step()'s own refusal reaches every rank
            said = f"rank 0: {own}" if rank == 0 else f"rank {rank}: rank 0 refused this step: {own}"
            assert found[call].startswith(said), (rank, found[call])  # rank 2 is no neighbour of rank 0

def test_a_later_stage_given_no_tensor_is_refused_at_its_forward():
    runner = StageRunner(torch.nn.Identity(), 2, 0, False, False, rank=1)
    saved = SavedActivations(frozenset({(2, 0, 0)}), frozenset(), None)
    with pytest.raises(PipelineUsageError, match=r"^rank 1: stage 2 is recomputed \(its R of microbatch 0\) but "
                                                 r"its forward is given no tensor input to keep: argument 0 \(str\)"):
        saved.forward(runner, 0, ("text",), None, True, {})
    assert not saved.checkpoints and not runner.states
