"""Property: any valid schedule, generated and run on real gloo processes, trains exactly like no pipeline.

Schedules come from ``pipeforge.testing.schedules``: random placements (a rank
may hold several stages, out of order, or none), B or I+W per microbatch,
overlap steps, and communication either lowered by codegen or written by the
strategy in random valid groups. Few examples (each spawns processes).
"""

from __future__ import annotations

import tempfile

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import pipeforge.testing
from pipeforge.generator import codegen
from pipeforge.tools.launch import spawn, summarize

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(300)]

SCHEDULES = st.one_of(
    pipeforge.testing.schedules(max_ranks=3, max_microbatches=4),
    pipeforge.testing.schedules(max_ranks=3, max_microbatches=4, comms="random"),
)


def run_both_models(rank: int, nproc: int, path: str) -> list[dict]:
    from pipeforge.tools.reference_check import CheckJob, check_rank

    return [check_rank(rank, nproc, CheckJob(path, model=model, steps=1, timeout=20.0)) for model in ("mlp", "tuple")]


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(schedule=SCHEDULES)
def test_any_valid_schedule_runs_like_no_pipeline(schedule):
    with tempfile.TemporaryDirectory() as out_dir:
        path = str(codegen(schedule, out_dir))
        outcomes = spawn(run_both_models, schedule.ranks, path, timeout=20, deadline=90)
    assert all(o.ok for o in outcomes), "\n".join(o.error for o in outcomes if not o.ok)
    for index in range(2):
        verdict = summarize([o.value[index] for o in outcomes])
        assert verdict["match"], (verdict, str(schedule.programs))
