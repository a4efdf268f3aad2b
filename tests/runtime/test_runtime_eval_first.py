"""A pipeline validated with eval() before it trains trains like the unpipelined model (float64).

A user's loop: one eval() for the validation loss, then step() with SGD. Stage 0
sends on a table made without a gradient (as rotary tables ride along); the
middle stages clamp it in place (a tensor that carries no gradient is theirs to
change) and pass it on. An activation's shapes header says which of its tensors
carry a gradient, and an eval() has no gradients to say it: before, the first
eval()'s header announced every tensor as carrying one and was kept, so every
later step gave the table a gradient nobody needed, and the in-place clamp made
every call fail (the automatic check, given the same all-gradient inputs,
refused the stage; without the check, the first step failed). Now the first
training step announces again what an eval announced, and the check gives a
stage the inputs a step gives it (gloo on 127.0.0.1, 1F1B on 2 and 4 ranks,
interleaved zero bubble on 2).
"""

from __future__ import annotations

import pytest

import pipeforge
from pipeforge.generator import codegen
from pipeforge.tools.launch import spawn
from tests.load import scaled
from tests.runtime.eval_first_jobs import STEPS, validate_then_train

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(180)]

WAIT = scaled(20.0)


@pytest.mark.parametrize("name,ranks", [("1f1b", 2), ("1f1b", 4), ("interleaved-zb", 2)])
def test_validate_first_then_train_equals_the_unpipelined_model(tmp_path, name, ranks):
    path = str(codegen(pipeforge.load(name, defines={"P": ranks, "M": 4}), tmp_path / "gen.py"))
    outcomes = spawn(validate_then_train, ranks, {"path": path, "wait": WAIT}, timeout=WAIT, deadline=120)
    assert all(o.ok for o in outcomes), "\n".join(o.error for o in outcomes if not o.ok)
    evals = [o.value["eval_diff"] for o in outcomes if o.value["eval_diff"] is not None]
    assert len(evals) == 1 and evals[0] <= 1e-12, evals  # the validation loss, on the last stage's rank
    for outcome in outcomes:
        report = outcome.value
        assert report["errors"] == [""] * (1 + STEPS), report["errors"]
        assert len(report["diffs"]) == STEPS and max(report["diffs"]) <= 1e-12, report["diffs"]
        # the table wants no gradient in any step's forward (nor in the check's), on every stage given one
        assert not any(report["seen"]) and (report["seen"] or outcome.rank == 0), report["seen"]
