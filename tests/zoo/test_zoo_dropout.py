"""Dropout on, against unpipelined training: the same masks from ``make_pipeline(rng_seed=...)``.

The GPT of ``nn.TransformerEncoderLayer`` blocks with dropout 0.3 (``gpt-dropout``), and the same GPT
with its LM head tied to the embedding (``tied-dropout``), float64, 2 and 4 gloo ranks, on 1F1B, ZB-H1,
interleaved 1F1B and ZBV: as written, with every (stage, microbatch) recomputed and with every one
offloaded. The unpipelined reference runs each stage's forward under
``pipeforge.runtime.microbatch_rng(seed, step, stage, microbatch)``; losses, merged outputs, every
gradient of both steps and the parameters after 2 SGD steps must be the same bits (the tied weight's two
uses summed in another order: to rounding, as in ``tests/zoo/test_zoo.py``). Two seeds give
different gradients (dropout is on and the seed reaches it), so the comparison can fail.
"""

from __future__ import annotations

import pytest

from pipeforge.generator import codegen
from pipeforge.passes.recompute import offload, recompute
from pipeforge.tools.launch import spawn
from tests.zoo.harness import Case
from tests.zoo.test_zoo import ROUNDING, load, verdict

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(900)]

SCHEDULES = ("1f1b", "zb-h1", "interleaved-1f1b", "zbv")
TRANSFORMS = {"plain": lambda s: s, "recompute": recompute, "offload": offload}
SEED = 2026
MODELS = ("gpt-dropout", "tied-dropout")


@pytest.mark.parametrize("ranks", [2, 4])
def test_dropout_equals_unpipelined_training(ranks, tmp_path):
    cases = []
    for name in SCHEDULES:
        for how, transform in TRANSFORMS.items():
            path = str(codegen(transform(load(name, ranks)), tmp_path / f"{name}-{how}"))
            cases += [Case(f"{name} {how} {model}", model, path, rng_seed=SEED) for model in MODELS]
    control = Case("1f1b plain, another seed", "gpt-dropout", cases[0].module_path, rng_seed=SEED + 1)
    outcomes = spawn("tests.zoo.harness:run_cases", ranks, [*cases, control], timeout=60, deadline=840)
    assert all(o.ok for o in outcomes), "\n".join(o.error for o in outcomes if not o.ok)
    failures = []
    for i, case in enumerate(cases):
        reports = [o.value[i] for o in outcomes]
        max_abs, max_rel, missing = verdict(reports)
        close = max_abs == 0.0 if case.model == "gpt-dropout" else max_rel <= ROUNDING
        if missing or not close or not all(r["compared"] for r in reports):
            failures.append(f"{case.label}: max_abs {max_abs:.3g} ({[r['worst'] for r in reports]}); "
                            f"missing {missing[:3]}")
    assert not failures, "\n".join(failures)
    # the other seed matches its own reference, and its gradients are not the first seed's
    assert verdict([o.value[-1] for o in outcomes])[0] == 0.0
    assert any(o.value[0]["grads"] != o.value[-1]["grads"] for o in outcomes)
