"""The simulator: exact timings of small hand-built schedules, closed forms, memory, errors, properties."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pipeforge
from pipeforge.errors import VerificationError
from pipeforge.ir import CostModel, MemorySpec, Placement
from pipeforge.sim import simulate
from tests.sim.sim_orders import gpipe, one_f_one_b, random_consistent, schedule_of

FULL_B = CostModel(F=1, I=1, W=1)  # B = I + W = 2


def starts(timeline) -> dict[str, tuple[float, float]]:
    return {str(e.actions[0]) if len(e.actions) == 1 else ";".join(map(str, e.actions)): (e.start, e.end)
            for e in timeline.events}


# Two ranks, two microbatches; B = 2. Worked by hand in the comments.
TWO_RANKS = [["0F0", "0F1", "0B0", "0B1"], ["1F0", "1B0", "1F1", "1B1"]]


@pytest.mark.parametrize("comm, expected, makespan", [
    # rank 1: F0 after 0F0 (1); B0 at 2; F1 when free (4), B1 at 5; rank 0: B0 after 1B0 (4), B1 after 1B1 (7).
    (0.0, {"0F0": (0, 1), "0F1": (1, 2), "1F0": (1, 2), "1B0": (2, 4), "0B0": (4, 6),
           "1F1": (4, 5), "1B1": (5, 7), "0B1": (7, 9)}, 9.0),
    # each cross-rank edge adds 0.5: 1F0 at 1.5, 0B0 at 4.5 + 0.5, 0B1 at 7.5 + 0.5.
    (0.5, {"0F0": (0, 1), "0F1": (1, 2), "1F0": (1.5, 2.5), "1B0": (2.5, 4.5), "0B0": (5, 7),
           "1F1": (4.5, 5.5), "1B1": (5.5, 7.5), "0B1": (8, 10)}, 10.0),
])
def test_hand_built_two_rank_schedule_runs_at_the_worked_times(comm, expected, makespan):
    timeline = simulate(schedule_of(TWO_RANKS, microbatches=2), CostModel(comm=comm))
    assert starts(timeline) == expected
    assert timeline.makespan == makespan


def test_steps_are_numbered_as_written_with_idle_and_communication_counted():
    rows = [["_", "0F0", "[0SEND_F0]", "0B0"], ["1RECV_F0", "1F0", "1B0"]]
    timeline = simulate(schedule_of(rows), FULL_B)
    assert [(e.rank, e.step) for e in timeline.events] == [(0, 1), (0, 3), (1, 1), (1, 2)]


@pytest.mark.parametrize("ranks", [2, 3, 4, 8])
@pytest.mark.parametrize("extra", [0, 1, 5])
@pytest.mark.parametrize("build", [one_f_one_b, gpipe])
def test_textbook_bubble_is_p_minus_1_over_m_plus_p_minus_1(build, ranks, extra):
    microbatches = ranks + extra
    timeline = simulate(build(ranks, microbatches), FULL_B)
    assert timeline.bubble_rate == pytest.approx((ranks - 1) / (microbatches + ranks - 1))
    assert timeline.makespan == pytest.approx(3 * (microbatches + ranks - 1))


@pytest.mark.parametrize("name", ["1f1b", "gpipe"])
@pytest.mark.parametrize("ranks, microbatches", [(2, 4), (4, 8), (4, 5), (8, 16)])
def test_library_1f1b_and_gpipe_have_the_textbook_bubble(name, ranks, microbatches):
    schedule = pipeforge.load(name, defines={"P": ranks, "M": microbatches})
    timeline = simulate(schedule, FULL_B)
    assert timeline.bubble_rate == pytest.approx((ranks - 1) / (microbatches + ranks - 1))


@pytest.mark.parametrize("ranks, microbatches", [(2, 4), (4, 4), (4, 8), (8, 8), (8, 24)])
def test_zb_h1_bubble_is_a_third_of_1f1b(ranks, microbatches):
    schedule = pipeforge.load("zb-h1", defines={"P": ranks, "M": microbatches})
    timeline = simulate(schedule, CostModel(F=1, I=1, W=1))
    assert timeline.bubble_rate == pytest.approx((ranks - 1) / (3 * microbatches + ranks - 1))
    assert max(timeline.peak_memory) <= ranks


@pytest.mark.parametrize("ranks, microbatches", [(2, 2), (4, 8), (6, 7)])
def test_1f1b_rank_r_holds_p_minus_r_activations(ranks, microbatches):
    timeline = simulate(one_f_one_b(ranks, microbatches))
    assert timeline.peak_memory == tuple(float(min(ranks - r, microbatches)) for r in range(ranks))


def test_gpipe_holds_every_microbatch():
    assert simulate(gpipe(3, 5)).peak_memory == (5.0, 5.0, 5.0)


@pytest.mark.parametrize("weights, expected", [(0.0, 1.0), (0.5, 1.5), (1.0, 2.0)])
def test_memory_weights_decide_what_i_releases(weights, expected):
    # F0 I0 F1 W0 I1 W1 on one rank: after I0 the rank still holds w (what only W releases); F1 adds 1.
    rows = [["0F0", "0I0", "0F1", "0W0", "0I1", "0W1"]]
    timeline = simulate(schedule_of(rows, microbatches=2), memory=MemorySpec(weights=weights))
    assert timeline.peak_memory == (expected,)


def test_overlap_step_lasts_the_sum_and_counts_its_forward_first():
    rows = [["0F0", "0F1", "(0B0;0F2)", "0B1", "0B2"]]
    timeline = simulate(schedule_of(rows, stages=1, microbatches=3, placement=Placement((0,))), FULL_B)
    overlap = next(e for e in timeline.events if len(e.actions) == 2)
    assert (overlap.start, overlap.end) == (2.0, 5.0)
    assert [(str(a), s, e) for a, s, e in overlap.action_spans()] == [("0B0", 2, 4), ("0F2", 4, 5)]
    assert timeline.peak_memory == (3.0,)


def test_actions_in_one_overlap_step_do_not_feed_each_other():
    rows = [["(0F0;0B0)"]]
    with pytest.raises(VerificationError, match=r"rank 0 step 0 \(\(0F0;0B0\)\) waits for 0F0"):
        simulate(schedule_of(rows, stages=1, placement=Placement((0,))))


@pytest.mark.parametrize("ranks", [2, 3, 5])
@pytest.mark.parametrize("comm", [0.0, 0.25, 2.0])
def test_comm_latency_is_added_on_every_cross_rank_edge(ranks, comm):
    rows = [[f"{r}F0", f"{r}B0"] for r in range(ranks)]
    timeline = simulate(schedule_of(rows), CostModel(F=1, I=1, W=1, comm=comm))
    assert timeline.makespan == pytest.approx(3 * ranks + 2 * (ranks - 1) * comm)


def test_same_rank_edges_carry_no_latency():
    rows = [["0F0", "1F0", "1B0", "0B0"]]  # both stages on rank 0
    timeline = simulate(schedule_of(rows, stages=2, placement=Placement((0, 0))), CostModel(comm=5.0))
    assert timeline.makespan == 6.0


def _two_chains(rows):
    from dataclasses import replace

    return replace(schedule_of(rows, stages=2), placements=(Placement((0, 1)), Placement((1, 0))))


def test_chains_are_separate():
    # chain 1 runs the stages the other way (stage 0 on rank 1); chain 0's 0F0 never feeds chain 1's 1F0@1.
    with pytest.raises(VerificationError, match=r"waits for 0F0@1, which no rank runs"):
        simulate(_two_chains([["0F0", "1F0@1", "0B0"], ["1F0", "1B0"]]))
    rows = [["0F0", "1F0@1", "0B0", "1B0@1"], ["0F0@1", "1F0", "1B0", "0B0@1"]]
    timeline = simulate(_two_chains(rows), FULL_B)
    # 1B0 on rank 1 at 2; 0B0 on rank 0 at 4; 1B0@1 (the last stage of chain 1) when rank 0 is free, 6;
    # 0B0@1 on rank 1 after it, at 8.
    assert starts(timeline) == {"0F0": (0, 1), "0F0@1": (0, 1), "1F0@1": (1, 2), "1F0": (1, 2), "1B0": (2, 4),
                                "0B0": (4, 6), "1B0@1": (6, 8), "0B0@1": (8, 10)}


@pytest.mark.parametrize("rows, message", [
    ([["0B0", "0F0"], ["1F0", "1B0"]], r"rank 0 step 0 \(0B0\) waits for 0F0 \(rank 0 step 1"),
    ([["0F0", "0B0"], ["1B0", "1F0"]], r"rank 1 step 0 \(1B0\) waits for 1F0"),
    ([["0F0", "0W0"], ["1F0", "1B0"]], r"waits for 0I0, which no rank runs"),
    ([["0F0", "0B0"], ["1F1", "1B0"]], r"rank 1 step 0 \(1F1\) waits for 0F1, which no rank runs"),
])
def test_inconsistent_orders_raise_naming_every_stuck_rank(rows, message):
    with pytest.raises(VerificationError, match=message) as raised:
        simulate(schedule_of(rows, microbatches=2))
    assert "cannot finish" in str(raised.value)


def test_a_deadlock_of_many_ranks_finishes_quickly_and_names_them_all():
    schedule = one_f_one_b(16, 32)
    rows = [list(map(str, program)) for program in schedule.programs]
    rows[5][0], rows[5][-1] = rows[5][-1], rows[5][0]  # rank 5 starts with its last backward
    with pytest.raises(VerificationError) as raised:
        simulate(schedule_of(rows, microbatches=32))
    assert "rank 5 step 0 (5B31)" in str(raised.value)


def test_costs_default_to_the_schedules_then_unit():
    from dataclasses import replace

    schedule = one_f_one_b(2, 2)
    assert simulate(schedule).makespan == 9.0
    assert simulate(replace(schedule, costs=CostModel(F=2, B=2))).makespan == 12.0
    assert simulate(replace(schedule, costs=CostModel(F=2, B=2)), CostModel(F=1, B=1)).makespan == 6.0


def test_per_stage_costs_apply_to_their_stage():
    costs = CostModel(per_stage=((1, "F", 3.0),))
    timeline = simulate(schedule_of([["0F0", "0B0"], ["1F0", "1B0"]]), costs)
    assert starts(timeline)["1F0"] == (1.0, 4.0)


def test_json_has_the_contract_fields():
    document = json.loads(json.dumps(simulate(one_f_one_b(4, 8)).to_json()))
    assert {"makespan", "bubble_rate", "peak_memory", "lower_bound", "ranks"} <= set(document)
    assert document["makespan"] == 33.0 and len(document["peak_memory"]) == 4
    assert {"busy", "span", "bubble_rate", "peak_memory"} <= set(document["ranks"][0])


def test_bubble_rate_is_the_zero_bubble_papers_definition():
    timeline = simulate(one_f_one_b(3, 4), CostModel(comm=0.5))
    busy = [s.busy for s in timeline.rank_stats]
    spans = [s.end - s.start for s in timeline.rank_stats]
    assert timeline.bubble_rate == pytest.approx(1 - sum(busy) / len(busy) / max(spans))


orders = st.builds(
    random_consistent,
    seed=st.integers(0, 10_000), ranks=st.integers(1, 4),
    stages=st.sampled_from([1, 2, 4]).map(lambda k: k),
    microbatches=st.integers(1, 5), split=st.booleans(), placement=st.sampled_from(["loop", "v"]),
).filter(lambda s: s.stages >= s.ranks or s.stages == 1)
costs = st.builds(CostModel, F=st.sampled_from([0.5, 1.0, 2.0]), I=st.sampled_from([1.0, 1.5]),
                  W=st.sampled_from([0.5, 1.0]), comm=st.sampled_from([0.0, 0.1, 1.0]))


def _dependencies_hold(timeline, costs) -> None:
    ends = {}
    for event in timeline.events:
        for action, _, end in event.action_spans():
            ends[action.kind.value, action.chain, action.stage, action.microbatch] = (end, event.rank)
    for event in timeline.events:
        for action in event.actions:
            s, m, c = action.stage, action.microbatch, action.chain
            needs = {"F": [("F", c, s - 1, m)], "W": [("I", c, s, m)]}.get(
                action.kind.value, [("F", c, s, m), ("B", c, s + 1, m), ("I", c, s + 1, m)])
            for key in needs:
                if key in ends:
                    end, rank = ends[key]
                    assert event.start >= end + (costs.comm if rank != event.rank else 0) - 1e-9


@settings(max_examples=60, deadline=None)
@given(orders, costs)
def test_random_consistent_orders_respect_dependencies_and_bounds(schedule, cost_model):
    timeline = simulate(schedule, cost_model)
    _dependencies_hold(timeline, cost_model)
    for rank in range(schedule.ranks):
        events = list(timeline.events_on(rank))
        assert all(a.end <= b.start + 1e-9 for a, b in zip(events, events[1:]))
    assert timeline.makespan >= timeline.lower_bound - 1e-9
    assert timeline.bubble_rate >= timeline.bubble_lower_bound - 1e-9
    assert sum(len(e.actions) for e in timeline.events) == schedule.action_count()


@settings(max_examples=30, deadline=None)
@given(orders, st.sampled_from([0.5, 2.0, 3.0]))
def test_scaling_every_cost_scales_the_makespan(schedule, factor):
    base = CostModel(F=1, I=1.5, W=0.5, comm=0.25)
    scaled = CostModel(F=factor, I=1.5 * factor, W=0.5 * factor, comm=0.25 * factor)
    assert simulate(schedule, scaled).makespan == pytest.approx(factor * simulate(schedule, base).makespan)
    assert simulate(schedule, scaled).bubble_rate == pytest.approx(simulate(schedule, base).bubble_rate)


def test_an_empty_schedule_has_zero_figures():
    from pipeforge.ir import Schedule

    timeline = simulate(Schedule("empty", 2, 2, 0, (Placement.loop(2, 2),), ((), ())))
    assert (timeline.makespan, timeline.bubble_rate, timeline.lower_bound) == (0.0, 0.0, 0.0)
    assert timeline.peak_memory == (0.0, 0.0)


def test_a_stuck_pipe_file_is_reported_at_its_source_lines():
    text = (
        "schedule bad(P = 2, M = 1) {\n"
        "    ranks P\n"
        "    stages P placement loop\n"
        "    microbatches M\n"
        "    rank 0 { B(0, 0) F(0, 0) }\n"
        "    rank 1 { F(1, 0) B(1, 0) }\n"
        "}\n"
    )
    with pytest.raises(VerificationError) as raised:
        simulate(pipeforge.loads(text, filename="bad.pipe"))
    report = raised.value.render()
    assert report.startswith("bad.pipe:5:14: error: the compute order cannot finish")
    assert "        rank 0 { B(0, 0) F(0, 0) }\n                 ^^^^^^^\n" in report
    assert "note: rank 1 is stuck at bad.pipe:6:14 (1F0)" in report
