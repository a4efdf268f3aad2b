"""Recompute and offload on the model zoo: every gradient equals the unpipelined model's, bit for bit.

Each of 1F1B, ZB-H1, interleaved 1F1B and ZBV with every (stage, microbatch)
recomputed (``passes.recompute``: R before each first backward) and with every
one offloaded (``passes.offload``: OFFLOAD after each F, RELOAD before each
first backward), on the GPT (``nn.TransformerEncoderLayer``), the Llama block,
the MoE and the tied GPT, float64, 2 and 4 gloo ranks: losses, merged outputs,
every gradient of both steps and the parameters after 2 SGD steps, against the
unpipelined model (the zoo harness). Dropout's masks: ``tests/runtime/test_runtime_saved.py``.
"""

from __future__ import annotations

import pytest

from pipeforge.generator import codegen
from pipeforge.passes.recompute import offload, recompute
from pipeforge.tools.launch import spawn
from pipeforge.verifier import verify
from tests.zoo.harness import Case
from tests.zoo.models import MODELS
from tests.zoo.test_zoo import EXACT, ROUNDING, load, verdict

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(900)]

SCHEDULES = ("1f1b", "zb-h1", "interleaved-1f1b", "zbv")
PASSES = {"recompute": recompute, "offload": offload}


@pytest.mark.parametrize("ranks", [2, 4])
def test_recompute_and_offload_equal_the_unpipelined_model(ranks, tmp_path):
    cases = []
    for name in SCHEDULES:
        for how, transform in PASSES.items():
            schedule = transform(load(name, ranks))
            assert any(a.kind.value in ("R", "OFFLOAD") for _, _, a in schedule.actions())
            assert verify(schedule).valid
            path = str(codegen(schedule, tmp_path / f"{name}-{how}"))
            cases += [Case(f"{name} {how} {model}", model, path) for model in MODELS]
    outcomes = spawn("tests.zoo.harness:run_cases", ranks, cases, timeout=60, deadline=840)
    assert all(o.ok for o in outcomes), "\n".join(o.error for o in outcomes if not o.ok)
    failures = []
    for i, case in enumerate(cases):
        reports = [o.value[i] for o in outcomes]
        max_abs, max_rel, missing = verdict(reports)
        exact = case.label.split()[0] in EXACT and case.model != "tied"
        if missing or (max_abs != 0.0 if exact else max_rel > ROUNDING) or not all(r["compared"] for r in reports):
            failures.append(f"{case.label}: max_abs {max_abs:.3g} max_rel {max_rel:.3g}; missing {missing[:3]}")
    assert not failures, "\n".join(failures)
