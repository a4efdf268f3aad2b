"""A step that failed on one rank leaves every rank able to step again (gloo, 2 ranks, float64).

A script that skips a bad batch catches the step's error on every rank (the
rank that failed, and the peer whose wait for it ended when the failed rank
closed its connections, not at its timeout), clears the
gradients and steps on: every later step equals the unpipelined model trained
on the same batches without the skipped one. Before, the next step aborted a
process inside gloo (``op.preamble.length <= op.nbytes``) or raised
``IndexError`` in ``decode_header``.
"""

from __future__ import annotations

import copy
import time

import pytest
import torch

import pipeforge
from pipeforge.generator import codegen
from pipeforge.runtime.p2p import PipelineError, decode_header
from pipeforge.tools.launch import spawn
from tests.load import scaled

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(240)]

WAIT = scaled(60.0)  # a wait's bound (times the load); the failed rank closes its connections, so its peer learns of it at once
STEPS, BAD = 4, 1  # step BAD fails


class FailsOnce(torch.nn.Module):
    """A stage that raises on its ``when``-th forward (a bad batch found mid-step)."""

    def __init__(self, inner: torch.nn.Module, when: int):
        super().__init__()
        self.inner, self.when, self.calls = inner, when, 0

    def forward(self, *args):
        self.calls += 1
        if self.calls == self.when:
            raise ValueError("a bad batch")
        return self.inner(*args)


def skip_a_bad_batch(rank: int, nproc: int, payload: tuple) -> dict:
    from pipeforge.tools import demo_models as models
    from pipeforge.tools.generated import load_module

    path, victim, when, model = payload
    generated = load_module(path)
    info = generated.SCHEDULE
    full = models.build_stages(model, info.stages, seed=0)
    reference = [copy.deepcopy(m) for m in full]
    mine = {s: copy.deepcopy(full[s]) for s in info.stages_of(rank)}
    wrapped = {s: FailsOnce(m, when) if rank == victim else m for s, m in mine.items()}
    pipe = generated.make_pipeline(wrapped, loss_fn=models.loss_fn, timeout=WAIT)
    pipe.preflight = False  # the failure is inside step(): no check's forward before it (it counts forwards)
    errors, worst = [], 0.0
    started = time.monotonic()
    for step in range(STEPS):
        x, y = models.make_batch(info.stages, 2 * info.microbatches, seed=step)
        try:
            pipe.step(*((x,) if pipe.holds_first else ()), target=y if pipe.holds_last else None)
        except (PipelineError, ValueError) as error:
            errors.append((step, f"{type(error).__name__}: {error}"))
            for module in mine.values():
                module.zero_grad(set_to_none=True)
            continue
        for xm, ym in zip(torch.tensor_split(x, info.microbatches), torch.tensor_split(y, info.microbatches)):
            models.loss_fn(models.run_stages(reference, xm), ym).backward()
        for stage, module in mine.items():
            for got, want in zip(module.parameters(), reference[stage].parameters()):
                worst = max(worst, (got.grad - want.grad / info.microbatches).abs().max().item())
        with torch.no_grad():  # one SGD step on both, gradients cleared
            for module in (*mine.values(), *reference):
                for param in module.parameters():
                    param -= 0.1 * (param.grad if module in mine.values() else param.grad / info.microbatches)
                    param.grad = None
    import torch.distributed as dist

    total = torch.ones(1)
    dist.all_reduce(total)  # the caller's own group is untouched by the pipeline's failure
    return {"errors": errors, "max_abs_diff": worst, "world": total.item(), "seconds": time.monotonic() - started}


@pytest.mark.parametrize("name,victim,when,model", [
    ("1f1b", 1, 2 * 2 + 2, "mlp"),      # rank 1, step 1, its 2nd forward: rank 0 times out waiting
    ("1f1b", 0, 2 * 2 + 1, "tuple"),    # rank 0, step 1, its 1st forward: rank 1 times out
    ("zb-h1", 1, 2 * 2 + 2, "tuple"),
])
def test_both_ranks_catch_a_failed_step_and_train_on_like_the_unpipelined_model(tmp_path, name, victim, when, model):
    path = str(codegen(pipeforge.load(name, defines={"P": 2, "M": 4}), tmp_path / "gen.py"))
    outcomes = spawn(skip_a_bad_batch, 2, (path, victim, when, model), timeout=WAIT, deadline=200)
    assert all(o.ok for o in outcomes), "\n".join(o.error for o in outcomes if not o.ok)
    for outcome in outcomes:
        report = outcome.value
        assert [step for step, _ in report["errors"]] == [BAD], report
        assert report["max_abs_diff"] <= 1e-12, report
        assert report["world"] == 2.0, report
        assert report["seconds"] < WAIT / 2, report  # the peer did not wait out its timeout
    assert "a bad batch" in outcomes[victim].value["errors"][0][1]
    told = outcomes[1 - victim].value["errors"][0][1]  # the peer is told what failed (tests/models/test_stage_errors)
    assert f"PeerStageError: rank {1 - victim}: the step stopped because rank {victim} failed at stage" in told, told


@pytest.mark.parametrize("words,problem", [
    ([2, 0, 1, 4, 0, 70], "malformed at word"),  # the second tensor runs past the header
    ([1, 99, 1, 4], "malformed at word"),      # no such dtype
    ([1, 0, 2, -1, 4], "negative shape"),
    ([-5], "announces -5 tensors"),
])
def test_a_header_pipeforge_did_not_write_is_a_pipeline_error(words, problem):
    header = torch.zeros(64, dtype=torch.int64)
    header[: len(words)] = torch.tensor(words)
    with pytest.raises(PipelineError, match=problem):
        decode_header(header)
