"""Dropout on, against unpipelined training: the same masks from ``make_pipeline(rng_seed=...)``.

The GPT of ``nn.TransformerEncoderLayer`` blocks with dropout 0.3 (``gpt-dropout``), float64, 2 and 4
gloo ranks, on 1F1B, ZB-H1, interleaved 1F1B and ZBV: as written, with every (stage, microbatch)
recomputed and with every one offloaded. The unpipelined reference runs each stage's forward under
``pipeforge.runtime.microbatch_rng(seed, step, stage, microbatch)``; losses, merged outputs, every
gradient of both steps and the parameters after 2 SGD steps must be the same bits. Two seeds give
different gradients (dropout is on and the seed reaches it), so the comparison can fail.
"""

from __future__ import annotations

import pytest

from pipeforge.generator import codegen
from pipeforge.passes.recompute import offload, recompute
from pipeforge.tools.launch import spawn
from tests.zoo.harness import Case
from tests.zoo.test_zoo import load, verdict

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(900)]

SCHEDULES = ("1f1b", "zb-h1", "interleaved-1f1b", "zbv")
TRANSFORMS = {"plain": lambda s: s, "recompute": recompute, "offload": offload}
SEED = 2026


@pytest.mark.parametrize("ranks", [2, 4])
def test_dropout_equals_unpipelined_training(ranks, tmp_path):
    cases = []
    for name in SCHEDULES:
        for how, transform in TRANSFORMS.items():
            path = str(codegen(transform(load(name, ranks)), tmp_path / f"{name}-{how}"))
            cases.append(Case(f"{name} {how}", "gpt-dropout", path, rng_seed=SEED))
    control = Case("1f1b plain, another seed", "gpt-dropout", cases[0].module_path, rng_seed=SEED + 1)
    outcomes = spawn("tests.zoo.harness:run_cases", ranks, [*cases, control], timeout=60, deadline=840)
    assert all(o.ok for o in outcomes), "\n".join(o.error for o in outcomes if not o.ok)
    failures = []
    for i, case in enumerate(cases):
        reports = [o.value[i] for o in outcomes]
        max_abs, _, missing = verdict(reports)
        if missing or max_abs != 0.0 or not all(r["compared"] for r in reports):
            failures.append(f"{case.label}: max_abs {max_abs:.3g} ({[r['worst'] for r in reports]}); "
                            f"missing {missing[:3]}")
    assert not failures, "\n".join(failures)
    # the other seed matches its own reference, and its gradients are not the first seed's
    assert verdict([o.value[-1] for o in outcomes])[0] == 0.0
    assert any(o.value[0]["grads"] != o.value[-1]["grads"] for o in outcomes)
