"""Property suites for the runtime, CI-sized: a fixed seed, one pair of gloo processes each.

- Random stage output structures (tuples of hidden states, the same tensor
  twice, views, inputs passed on, parameters, tensors without grad, integer and
  boolean tensors) through every library schedule on 2 ranks: each trains like
  the unpipelined model in float64, or is refused at make_pipeline naming the
  rank and stage; never wrong.
- Every schedule ``pipeforge.testing`` draws for 2 ranks (valid by construction,
  and verify says so), lowered by ``pipeforge.lower`` or with communication
  written by the strategy, split backward and overlap steps included: the
  generated module trains like the unpipelined model (the differential test of
  "a valid verdict means it runs right").
- Every verdict-valid schedule of a small family of bidirectional ones (each
  chain's placement loop or reverse, so a rank may hold a stage in both chains;
  2 or 4 microbatches; three orders): trains like the unpipelined model over
  three steps (a rank holding one stage in both chains once kept the last
  step's summed gradients in its chain-1 copy).
"""

from __future__ import annotations

import itertools
import re

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

import pipeforge
import pipeforge.testing
from pipeforge.generator import codegen
from pipeforge.library import names
from pipeforge.tools.launch import spawn
from tests.runtime.outputs_jobs import ITEMS

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(400)]

WAIT = 60.0  # seconds a rank waits for a peer: waits end by event, this only bounds a dead peer


def drawn(strategy, count: int) -> list:
    """``count`` examples of ``strategy``, the same on every run (hypothesis, derandomized)."""
    found = []

    @settings(max_examples=count, derandomize=True, database=None, phases=[Phase.generate], deadline=None,
              suppress_health_check=list(HealthCheck))
    @given(strategy)
    def collect(example):
        found.append(example)

    collect()
    return found[:count]


OUTPUTS = st.lists(st.lists(st.sampled_from(ITEMS), min_size=1, max_size=4).map(tuple), min_size=3, max_size=3)


def test_random_stage_outputs_through_every_library_schedule_train_right_or_are_refused(tmp_path):
    modules = {}
    for name in names():
        schedule = pipeforge.load(name, defines={"P": 2, "M": 4})
        modules[name] = (str(codegen(schedule, tmp_path / f"lib_{name.replace('-', '_')}.py")), schedule.stages)
    structures = drawn(OUTPUTS, 2 * len(modules))
    cases, labels = [], []
    for index, structure in enumerate(structures):
        name = sorted(modules)[index % len(modules)]
        path, stages = modules[name]
        cases.append((path, list(structure[: stages - 1]), index))
        labels.append((name, structure[: stages - 1]))
    assert {name for name, _ in labels} == set(names())
    outcomes = spawn("tests.runtime.outputs_jobs:run_cases", 2, (WAIT, cases), timeout=WAIT, deadline=380)
    assert all(o.ok for o in outcomes), "\n".join(o.error for o in outcomes if not o.ok)
    for index, label in enumerate(labels):
        for outcome in outcomes:
            report = outcome.value[index]
            if "refused" in report:
                assert report.get("step") is None, (label, report)  # refused at make_pipeline, not mid-training
                assert re.search(rf"rank {outcome.rank}\b.*stage \d+", report["refused"]), (label, report)
            else:
                assert report["max_abs_diff"] <= 1e-10, (label, outcome.rank, report)


SCHEDULES = st.one_of(
    pipeforge.testing.schedules(min_ranks=2, max_ranks=2, max_microbatches=4, lowered=True),
    pipeforge.testing.schedules(min_ranks=2, max_ranks=2, max_microbatches=4, comms="random"),
)


def test_every_valid_generated_schedule_trains_like_the_unpipelined_model(tmp_path):
    jobs, shown = [], []
    for index, schedule in enumerate(drawn(SCHEDULES, 10)):
        assert pipeforge.verify(schedule).valid
        path = str(codegen(schedule, tmp_path / f"drawn_{index}.py"))
        for model in ("mlp", "tuple"):
            jobs.append({"module_path": path, "model": model, "timeout": WAIT, "steps": 2})
            shown.append((index, model, schedule.stages, schedule.microbatches))
    assert_each_trains_like_the_unpipelined_model(jobs, shown)


def assert_each_trains_like_the_unpipelined_model(jobs: list[dict], shown: list[tuple]) -> None:
    """Every ``CheckJob`` of ``jobs`` on 2 gloo ranks: each matches the unpipelined model on every rank
    (a failure names the job by its entry of ``shown``)."""
    outcomes = spawn("tests.runtime.test_runtime_fuzz:check_all", 2, jobs, timeout=WAIT, deadline=380)
    assert all(o.ok for o in outcomes), "\n".join(o.error for o in outcomes if not o.ok)
    for index, label in enumerate(shown):
        for outcome in outcomes:
            report = outcome.value[index]
            assert report["match"] and report["max_abs_diff"] <= 1e-9, (label, report)


def check_all(rank: int, nproc: int, jobs: list[dict]) -> list[dict]:
    from pipeforge.tools.reference_check import CheckJob, check_rank

    return [check_rank(rank, nproc, CheckJob(**job)) for job in jobs]


ORDERS = {  # a rank's program: ``a`` its stage in chain 0, ``b`` in chain 1, ``H`` microbatches a chain
    "chains in turn": "for m in 0 .. H { F@0(a, m) } for m in H .. M { F@1(b, m) } "
                      "for m in 0 .. H { B@0(a, H - 1 - m) } for m in H .. M { B@1(b, M - 1 - (m - H)) }",
    "forwards interleaved": "for m in 0 .. H { F@0(a, m) F@1(b, H + m) } for m in 0 .. H { B@0(a, m) B@1(b, H + m) }",
    "one by one": "for m in 0 .. H { F@0(a, m) B@0(a, m) } for m in H .. M { F@1(b, m) B@1(b, m) }",
}


def two_chain_family():
    """(label, source) of every member: placements x microbatches x orders."""
    stage_of = {"loop": "r", "reverse": "P - 1 - r"}
    for (first, second), microbatches, (order, body) in itertools.product(
            itertools.product(stage_of, repeat=2), (2, 4), ORDERS.items()):
        yield (first, second, microbatches, order), f"""schedule family(P = 2, M = {microbatches}) {{
    ranks P
    stages P placement {first}, {second}
    microbatches M
    let H = M // 2
    rank r {{
        let a = {stage_of[first]}
        let b = {stage_of[second]}
        {body}
    }}
}}
"""


def test_every_valid_schedule_of_a_two_chain_family_trains_like_the_unpipelined_model(tmp_path):
    jobs, shown = [], []
    for index, (label, source) in enumerate(two_chain_family()):
        schedule = pipeforge.loads(source)
        if not pipeforge.verify(schedule).valid:
            continue
        path = str(codegen(schedule, tmp_path / f"family_{index}.py"))
        for model in ("mlp", "tuple"):
            jobs.append({"module_path": path, "model": model, "timeout": WAIT, "steps": 3})
            shown.append((*label, model))
    assert len(shown) >= 32  # most of the family is valid; all of it must train right
    assert_each_trains_like_the_unpipelined_model(jobs, shown)
