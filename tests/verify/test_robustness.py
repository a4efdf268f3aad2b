"""verify never crashes: any schedule, however broken, gets a report (and its JSON and text)."""

from __future__ import annotations

import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeforge.ir import Action, ActionKind, Placement, Schedule, Step
from pipeforge.verifier import KINDS, verify

SOME = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
COMPUTE = [ActionKind.F, ActionKind.B, ActionKind.I, ActionKind.W]
COMM = [ActionKind.SEND_F, ActionKind.RECV_F, ActionKind.SEND_B, ActionKind.RECV_B]


@st.composite
def soups(draw) -> Schedule:
    """Schedules of random actions: stages, microbatches and chains a little out of range, random groups."""
    ranks = draw(st.integers(1, 3))
    stages = draw(st.integers(1, 4))
    microbatches = draw(st.integers(1, 3))
    chains = draw(st.integers(1, 2))
    top = ranks if draw(st.integers(0, 9)) == 0 else ranks - 1  # now and then a rank with no program
    placements = tuple(Placement(tuple(draw(st.integers(0, top)) for _ in range(stages))) for _ in range(chains))
    stage = st.integers(0, stages)
    mb = st.integers(0, microbatches)
    chain = st.integers(0, chains)
    compute = st.builds(Action, stage, st.sampled_from(COMPUTE), mb, chain)
    comm = st.builds(Action, stage, st.sampled_from(COMM), mb, chain)
    step = st.one_of(
        compute.map(lambda a: Step((a,))),
        st.lists(compute, min_size=1, max_size=2).map(lambda acts: Step(tuple(acts), overlap=True)),
        st.lists(comm, min_size=1, max_size=3).map(lambda acts: Step(tuple(acts))),
        stage.map(lambda s: Step((Action(s, ActionKind.REDUCE_GRAD),))),
        st.just(Step()),
    )
    programs = tuple(tuple(draw(st.lists(step, max_size=8))) for _ in range(ranks))
    return Schedule("soup", ranks, stages, microbatches, placements, programs)


@SOME
@given(soups(), st.sampled_from(["rendezvous", "buffered"]), st.sampled_from([None, 1.0, 2.5]))
def test_any_schedule_gets_a_report(schedule, semantics, limit):
    report = verify(schedule, semantics=semantics, memory_limit=limit)
    assert report.valid == (not report.violations)
    assert {v.kind for v in report.violations} <= set(KINDS)
    json.dumps(report.to_json())
    assert report.render()
    for v in report.violations:
        assert v.step is None or 0 <= v.step < len(schedule.programs[v.rank])
