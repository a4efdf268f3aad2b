"""A target or input whose rows do not split like the batch is refused, naming it, on every rank.

Before, a target with fewer rows than the batch was broadcast against each
microbatch's output (exit 0, a wrong loss). Now the first step learns the
batch's rows from stage 0's rank, and every later step's greeting carries a
refusal to the neighbours, so both ranks refuse together, the other rank with
the refusing rank's message; the steps between train like the unpipelined
model (gloo, 2 ranks, float64). On one process, the calls after the first
that split at once meet the same checks as the first.
"""

from __future__ import annotations

import copy
import re

import pytest
import torch

import pipeforge
from pipeforge.generator import codegen
from pipeforge.runtime.rows import splits_like
from pipeforge.tools.launch import spawn
from tests.demo_jobs import gradient_difference

WAIT = 60.0  # seconds; every refusal here is told, never waited out


class TakesInputs(torch.nn.Module):
    """A stage that accepts per-stage keyword inputs (and ignores them)."""

    def __init__(self, inner: torch.nn.Module):
        super().__init__()
        self.inner = inner

    def forward(self, x, **inputs):
        return self.inner(x)


def trained(mine: dict[int, torch.nn.Module], reference: list[torch.nn.Module], x: torch.Tensor,
            y: torch.Tensor) -> str:
    """After a step of 4 microbatches: "trained: " and the largest difference of this rank's gradients from
    the unpipelined model's on the same batch; every gradient of both cleared after."""
    worst = gradient_difference(mine, reference, x, y, 4)
    for module in (*mine.values(), *reference):
        module.zero_grad(set_to_none=True)
    return f"trained: {worst:.1e}"


def steps_with_bad_rows(rank: int, nproc: int, path: str) -> list[str]:
    from pipeforge.runtime import PipelineUsageError
    from pipeforge.tools import demo_models as models
    from pipeforge.tools.generated import load_module

    generated = load_module(path)
    info = generated.SCHEDULE
    full = models.build_stages("mlp", info.stages, seed=0)
    reference = [copy.deepcopy(m) for m in full]
    mine = {s: copy.deepcopy(full[s]) for s in info.stages_of(rank)}
    pipe = generated.make_pipeline({s: TakesInputs(m) for s, m in mine.items()}, loss_fn=models.loss_fn, timeout=WAIT)
    x, y = models.make_batch(info.stages, 8, seed=0)
    good = torch.zeros(8, 3)
    plan = [("target", y[:4], None), ("good", y, None), ("target", y[:6], None), ("shared", y, good[:6]),
            ("good", y, good)]
    results = []
    for what, target, mask in plan:
        shared = {"mask": mask} if mask is not None else None
        try:
            pipe.step(*((x,) if pipe.holds_first else ()), target=target if pipe.holds_last else None,
                      shared_kwargs=shared if rank == 1 or what != "shared" else {"mask": good})
        except PipelineUsageError as error:
            results.append(f"refused: {error}")
            continue
        results.append(trained(mine, reference, x, y))
    # a fresh pipeline whose first batch holds a keyword of 6 rows beside x's 8
    fresh = generated.make_pipeline({s: TakesInputs(m) for s, m in mine.items()}, loss_fn=models.loss_fn,
                                    timeout=WAIT)
    try:
        fresh.step(*((x,) if rank == 0 else ()), target=y if rank == 1 else None,
                   **({"extra": good[:6]} if rank == 0 else {}))
    except PipelineUsageError as error:
        results.append(f"refused: {error}")
    extra = torch.zeros(8, 3)  # the batch corrected: its keyword now of the batch's rows, trained as usual
    fresh.step(*((x,) if rank == 0 else ()), target=y if rank == 1 else None, **({"extra": extra} if rank == 0 else {}))
    results.append("trained")
    return results


@pytest.mark.distributed
@pytest.mark.timeout(240)
def test_rows_that_do_not_split_like_the_batch_are_refused_on_every_rank(tmp_path):
    path = str(codegen(pipeforge.load("1f1b", defines={"P": 2, "M": 4}), tmp_path / "rows.py"))
    outcomes = spawn(steps_with_bad_rows, 2, path, timeout=WAIT, deadline=200)
    assert all(o.ok for o in outcomes), "\n".join(o.error for o in outcomes if not o.ok)
    first, last = outcomes[0].value, outcomes[1].value
    assert last[0].startswith("refused: rank 1: target has 4 rows and the batch 8: a tensor split into 4 "
                              "microbatches must split like the batch"), last[0]
    told = "refused: rank {}: rank {} refused this step: {} (this rank learned it here: rank {}: rank {}'s {})"
    # the other rank raises the refusing rank's own message (a PeerRefusedError, a PipelineUsageError)
    assert first[0] == told.format(0, 1, last[0].removeprefix("refused: rank 1: "), 0, 1, "word on the batch's rows")
    assert last[2].startswith("refused: rank 1: target has 6 rows and the batch 8"), last[2]
    assert last[3].startswith("refused: rank 1: shared_kwargs['mask'] has 6 rows and the batch 8"), last[3]
    # step 2 follows a step every rank agreed on, so no rank greets: rank 0 learns of the refusal where its
    # first wait on rank 1 breaks (rank 1 closed its connections); step 3 follows a failed step and greets
    learned = told.format(0, 1, last[2].removeprefix("refused: rank 1: "), 0, 1, "").removesuffix("rank 1's )")
    assert first[2].startswith(learned), (first[2], learned)
    # (its first post or wait on rank 1, whichever meets the closed connection first)
    assert re.match(r"(posting )?\[0(SEND|RECV)_[FB]\d\] (with rank\(s\) 1 )?failed", first[2].removeprefix(learned)), first[2]
    assert first[3] == told.format(0, 1, last[3].removeprefix("refused: rank 1: "), 0, 1, "greeting")
    assert first[5].startswith("refused: rank 0: step()/eval() keyword 'extra' has 6 rows and the batch 8"), first[5]
    assert last[5] == told.format(1, 0, first[5].removeprefix("refused: rank 0: "), 1, 0, "word on the batch's rows")
    for results in (first, last):
        assert results[1] == results[4] == "trained: 0.0e+00", results
        assert results[6] == "trained", results


@pytest.mark.parametrize("rows,batch,chunks,fits", [
    (8, 8, 4, True), (4, 8, 4, False), (16, 8, 4, True),  # a flattened target of two rows per batch row
    (12, 8, 4, False), (12, 6, 4, False),  # a multiple whose microbatches are not the batch's times two
    (10, 5, 2, False), (10, 5, 5, True), (7, 7, 3, True),
])
def test_what_splits_like_the_batch(rows, batch, chunks, fits):
    assert splits_like(rows, batch, chunks) is fits


def one_process_calls(rank: int, nproc: int, path: str) -> list[str]:
    """After a first step, calls the checks refuse between calls split at once (``Pipeline._prepare``'s ``_passed``)."""
    from pipeforge.runtime import PipelineUsageError
    from pipeforge.tools import demo_models as models
    from pipeforge.tools.generated import load_module

    generated = load_module(path)
    full = models.build_stages("mlp", 1, seed=0)
    mine = copy.deepcopy(full[0])
    pipe = generated.make_pipeline({0: mine}, loss_fn=models.loss_fn, timeout=WAIT)
    x, y = models.make_batch(1, 8, seed=0)
    plan = [(x, y), (x, y[:4]), (x.float(), y), (x[:6], y[:6]), (x, (y,)), (x, y)]
    results = []
    for batch, target in plan:
        try:
            pipe.step(batch, target=target)
        except PipelineUsageError as error:
            results.append(f"refused: {error}")
            continue
        except Exception as error:  # noqa: BLE001 (the loss's own error on a target it cannot take)
            results.append(f"failed: {type(error).__name__}")
            continue
        results.append(trained({0: mine}, full, x, y))
    return results


@pytest.mark.distributed
@pytest.mark.timeout(120)
def test_later_calls_on_one_process_are_checked_as_the_first(tmp_path):
    path = str(codegen(pipeforge.load("1f1b", defines={"P": 1, "M": 4}), tmp_path / "one.py"))
    outcomes = spawn(one_process_calls, 1, path, timeout=WAIT, deadline=100)
    assert outcomes[0].ok, outcomes[0].error
    results = outcomes[0].value
    assert results[0] == results[-1] == "trained: 0.0e+00", results
    assert results[1].startswith("refused: rank 0: target has 4 rows and the batch 8"), results[1]
    assert results[2] == results[3] == ("refused: rank 0: the batch changed shape since the first step; build a "
                                        "new pipeline for another batch shape"), results
    assert results[4] == "failed: StageError", results[4]  # a tuple target goes through every check to loss_fn
