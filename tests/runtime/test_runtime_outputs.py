"""Every form a stage output may take trains like the unpipelined model (gloo, 2 ranks, float64).

The same tensor returned twice, a view of an input, an input returned as it is,
an output aliasing a parameter, a tensor that does not require grad beside one
that does, integer and boolean tensors (alone too: an integer-only activation
has no gradient to send back): each case runs two training steps under a
schedule with a full backward (1F1B), one that splits it (ZB-H1) and one that
hands activations between stages of one rank (ZBV), and every gradient equals
the unpipelined model's.
"""

from __future__ import annotations

import pytest

import pipeforge
from pipeforge.generator import codegen
from pipeforge.tools.launch import spawn

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(300)]

CASES = {
    "same tensor twice": ("h", "same"),
    "a view of the output": ("h", "view"),
    "a view of an input": ("h", "input_view"),
    "an input as it is": ("input", "h"),
    "a parameter": ("h", "param"),
    "a tensor without grad": ("h", "nograd"),
    "an integer tensor": ("int", "h"),
    "integers alone": ("int",),
    "booleans alone": ("bool",),
    "all at once": ("bool", "h", "same", "param", "int", "view"),
}
SCHEDULES = ("1f1b", "zb-h1", "zbv")
WAIT = 60.0  # seconds a rank waits for a peer: waits end by event, this only bounds a dead peer


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    folder = tmp_path_factory.mktemp("outputs")
    jobs, labels = [], []
    for name in SCHEDULES:
        schedule = pipeforge.load(name, defines={"P": 2, "M": 4})
        path = str(codegen(schedule, folder / f"schedule_{name.replace('-', '_')}.py"))
        stages = pipeforge.load(name, defines={"P": 2, "M": 4}).stages
        for case, items in CASES.items():
            jobs.append((path, [items] * (stages - 1), 3))
            labels.append((name, case))
    outcomes = spawn("tests.runtime.outputs_jobs:run_cases", 2, (WAIT, jobs), timeout=WAIT, deadline=280)
    assert all(o.ok for o in outcomes), "\n".join(o.error for o in outcomes if not o.ok)
    return {label: [o.value[index] for o in outcomes] for index, label in enumerate(labels)}


@pytest.mark.parametrize("schedule", SCHEDULES)
@pytest.mark.parametrize("case", sorted(CASES))
def test_a_stage_output_trains_like_the_unpipelined_model(reports, schedule, case):
    for rank, report in enumerate(reports[(schedule, case)]):
        assert "refused" not in report, f"rank {rank}: {report}"
        assert report["max_abs_diff"] <= 1e-12, f"rank {rank}: {report}"


SAME_CHAINS = """
schedule same_chains(P = 2, M = 4) {
    ranks P
    stages P placement loop, loop    # each rank holds its stage in both chains
    microbatches M
    rank r {
        for m in 0 .. M // 2 { F@0(r, m) }
        for m in M // 2 .. M { F@1(r, m) }
        for m in 0 .. M // 2 { B@0(r, M // 2 - 1 - m) }
        for m in M // 2 .. M { B@1(r, M - 1 - (m - M // 2)) }
    }
}
"""


def test_a_stage_held_in_both_chains_on_one_rank_trains_right_step_after_step(tmp_path):
    source = tmp_path / "same_chains.pipe"
    source.write_text(SAME_CHAINS)
    schedule = pipeforge.load(str(source))
    assert pipeforge.verify(schedule).valid
    path = str(codegen(schedule, tmp_path / "same_chains.py"))
    job = {"module_path": path, "steps": 3, "timeout": WAIT}
    outcomes = spawn("pipeforge.tools.reference_check:check_job_fields", 2, job, timeout=WAIT, deadline=200)
    assert all(o.ok for o in outcomes), "\n".join(o.error for o in outcomes if not o.ok)
    for outcome in outcomes:
        assert outcome.value["match"], outcome.value
        assert outcome.value["max_abs_diff"] <= 1e-12, outcome.value
