"""simulate with R, OFFLOAD and RELOAD: costs, the copy lane, memory, sound bounds, pictures and trace."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import pipeforge
import pipeforge.testing as pt
from pipeforge.interop.chrome_trace import trace_events
from pipeforge.ir import ActionKind, CostModel, MemorySpec
from pipeforge.optimizer.memory_actions import optimize_memory
from pipeforge.passes.recompute import offload, recompute
from pipeforge.render.grid import render_text

OFFLOADING = """schedule off(P = 2, M = 3) {
    ranks P
    stages P placement loop
    microbatches M
    costs { F = 1  I = 1  W = 1  OFFLOAD = 0.5  RELOAD = 0.5 }
    memory { limit = 2 }
    rank 0 { 0F0 0F1 0OFFLOAD0 0F2 0OFFLOAD1 0RELOAD0 0B0 0RELOAD1 0B1 0B2 }
    rank 1 { 1F0 1B0 1F1 1B1 1F2 1B2 }
}
"""


def test_transfers_run_on_the_copy_lane_beside_the_compute():
    timeline = pipeforge.simulate(pipeforge.loads(OFFLOADING))
    got = [(str(e.actions[0]), e.start, e.end, e.lane) for e in timeline.events if e.rank == 0]
    assert got == [
        ("0F0", 0.0, 1.0, "compute"), ("0F1", 1.0, 2.0, "compute"),
        ("0OFFLOAD0", 2.0, 2.5, "copy"),  # issued when F1 ends
        ("0F2", 2.5, 3.5, "compute"),  # 2 held in program order, 3 with OFFLOAD0 in flight: waits for it
        ("0OFFLOAD1", 3.5, 4.0, "copy"), ("0RELOAD0", 4.0, 4.5, "copy"),  # one transfer at a time
        ("0B0", 4.5, 6.5, "compute"),  # after its reload (and 1B0, ended at 4)
        ("0RELOAD1", 6.5, 7.0, "copy"), ("0B1", 7.0, 9.0, "compute"), ("0B2", 10.0, 12.0, "compute"),
    ]
    rank0 = timeline.rank_stats[0]
    assert rank0.busy == 9.0 and rank0.span == 12.0  # the copy lane is not busy time
    assert timeline.peak_memory == (2.0, 1.0)
    lines = render_text(timeline, width=48).splitlines()
    assert lines[1].startswith("  copy |") and "O0" in lines[1] and "L1" in lines[1]
    copy_events = [e for e in trace_events(timeline) if e.get("tid") == 2 and e["ph"] == "X"]
    assert [e["name"] for e in copy_events] == ["0OFFLOAD0", "0OFFLOAD1", "0RELOAD0", "0RELOAD1"]


def test_a_forward_waits_for_an_offload_only_when_the_memory_limit_needs_it():
    """At limit 2, F2 would hold 3 with OFFLOAD0 still in flight: it waits for it (2.5); at limit 3, or with
    no limit, it starts when F1 ends (2.0), and so does it with free transfers. B0 waits for its RELOAD
    either way, and rank 1 never waits for rank 0's copy lane."""
    def timeline(text: str):
        return pipeforge.simulate(pipeforge.loads(text))

    def start(text: str, action: str) -> float:
        return next(e.start for e in timeline(text).events if str(e.actions[0]) == action)

    roomy, unlimited = (OFFLOADING.replace("limit = 2", "limit = 3"),
                        OFFLOADING.replace("    memory { limit = 2 }\n", ""))
    fast = OFFLOADING.replace("OFFLOAD = 0.5  RELOAD = 0.5", "OFFLOAD = 0  RELOAD = 0")
    assert start(OFFLOADING, "0F2") == 2.5 and start(fast, "0F2") == 2.0
    assert start(roomy, "0F2") == 2.0 and start(unlimited, "0F2") == 2.0
    assert start(fast, "0B0") == 4.0 and start(OFFLOADING, "0B0") == 4.5 and start(unlimited, "0B0") == 4.0
    assert start(fast, "1F2") == start(OFFLOADING, "1F2") == start(unlimited, "1F2")
    # what simulate reports: the program-order peak (verify's count) and the timed one (OFFLOAD0 in flight)
    assert timeline(OFFLOADING).peak_memory == timeline(roomy).peak_memory == (2.0, 1.0)
    assert timeline(OFFLOADING).timed_peak_memory == (2.0, 1.0)
    assert timeline(roomy).timed_peak_memory == (3.0, 1.0)


def test_recompute_costs_default_to_the_forward_and_the_checkpoint_sets_the_peak():
    plain = pipeforge.load("1f1b", defines={"P": 4, "M": 8})
    rebuilt = pipeforge.load("1f1b-recompute", defines={"P": 4, "M": 8})
    assert rebuilt.programs == recompute(plain).programs
    costs = CostModel(F=1.0, I=1.0, W=1.0)
    timeline = pipeforge.simulate(rebuilt, costs, memory=MemorySpec(checkpoint=0.1))
    assert sum(s.busy for s in timeline.rank_stats) == 4 * 8 * (1 + 1 + 2)  # F, R (= F), B
    # rank 0 holds 4 checkpoints, then rebuilds one: 3 * 0.1 + 1 at most, against 1F1B's 4
    assert abs(timeline.peak_memory[0] - 1.3) < 1e-9
    assert pipeforge.simulate(plain, costs).peak_memory[0] == 4.0
    cheap = pipeforge.simulate(rebuilt, replace(costs, R=0.5, per_stage=((0, "R", 2.0),)))
    assert cheap.rank_stats[0].busy == 8 * (1 + 2 + 2) and cheap.rank_stats[1].busy == 8 * (1 + 0.5 + 2)


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck), database=None)
@given(pt.schedules(max_ranks=3, max_stages_per_rank=2, max_microbatches=4, memory=True), st.data())
def test_bounds_stay_sound_with_recompute_and_offload(schedule, data):
    keys = sorted({(a.stage, a.microbatch, a.chain) for _, _, a in schedule.actions() if a.kind.value == "F"})
    rebuilt = data.draw(st.sets(st.sampled_from(keys)))
    schedule = offload(recompute(schedule, rebuilt), data.draw(st.sets(st.sampled_from(keys))) - rebuilt)
    costs = CostModel(F=data.draw(st.sampled_from([0.5, 1.0, 2.0])), I=1.0, W=data.draw(st.sampled_from([0.5, 1.0])),
                      R=data.draw(st.sampled_from([None, 0.5])), OFFLOAD=data.draw(st.sampled_from([0.0, 0.7, 3.0])))
    timeline = pipeforge.simulate(schedule, costs, memory=replace(schedule.memory, checkpoint=0.1))
    assert timeline.makespan >= timeline.bounds.makespan - 1e-9
    assert timeline.work_bubble_rate >= timeline.work_bound.bubble_rate - 1e-9
    spans = max(s.span for s in timeline.rank_stats)
    assert spans >= timeline.work_bound.max_span - 1e-9


def test_a_cost_file_gives_recompute_checkpoint_and_transfer_over_the_host_link(tmp_path):
    import json

    import pytest

    from pipeforge.sim.costfile import CostFileError, read_cost_file

    path = tmp_path / "costs.json"
    path.write_text(json.dumps({"host_bandwidth": 1000, "stages": [
        {"F": 1, "I": 1, "W": 1, "R": 0.8, "activation": 2000, "checkpoint": 100},
        {"F": 1, "I": 1, "W": 1, "RELOAD": 0.25, "activation": 1000, "checkpoint": 50}]}))
    found = read_cost_file(path)
    duration = found.costs.duration
    assert duration(ActionKind.R, 0) == 0.8 and duration(ActionKind.R, 1) == 1.0  # default: the stage's F
    assert duration(ActionKind.OFFLOAD, 0) == 2.0 and duration(ActionKind.RELOAD, 0) == 2.0  # 2000 / 1000
    assert duration(ActionKind.OFFLOAD, 1) == 1.0 and duration(ActionKind.RELOAD, 1) == 0.25  # given wins
    assert found.memory(MemorySpec()).checkpoints == (0.05, 0.025)  # in M_B = the largest activation
    path.write_text(json.dumps({"stages": [{"F": 1, "I": 1, "W": 1, "activation": 10, "checkpoint": 20}]}))
    with pytest.raises(CostFileError, match=r"\$\.stages\[0\]\.checkpoint: is more than the stage's activation"):
        read_cost_file(path)
    path.write_text(json.dumps({"host_bandwidth": 5, "stages": [{"F": 1, "I": 1, "W": 1}]}))
    with pytest.raises(CostFileError, match=r"\$\.host_bandwidth: needs 'activation'"):
        read_cost_file(path)


@pytest.mark.parametrize("ranks, microbatches, fraction", [(2, 4, 0.5), (4, 8, 0.5), (4, 8, 0.75), (8, 24, 0.5)])
def test_the_work_bound_of_a_recomputing_schedule_counts_the_recompute_its_limit_forces(ranks, microbatches,
                                                                                         fraction):
    """simulate's bound on schedules of this work that may recompute (sim/bounds/recompute.py): no lower than
    with no memory argument, no higher than the schedule's own span or than what optimize finds."""
    costs = CostModel(F=18.5, I=18.1, W=9.3, comm=0.6)
    memory = MemorySpec(max(1.0, fraction * ranks), 0.37, checkpoint=0.05)
    full = replace(pipeforge.load("1f1b-recompute", defines={"P": ranks, "M": microbatches}), memory=memory)
    timeline = pipeforge.simulate(full, costs)
    bound = timeline.work_bound
    assert bound.max_span <= max(s.span for s in timeline.rank_stats) + 1e-9
    free = pipeforge.simulate(replace(full, memory=replace(memory, limit=None)), costs).work_bound
    assert bound.max_span >= free.max_span - 1e-9
    plain = replace(pipeforge.load("1f1b", defines={"P": ranks, "M": microbatches}), memory=memory)
    found, _ = optimize_memory(plain, recompute="auto", costs=costs, memory_limit=memory.limit, time_limit=2)
    assert bound.max_span <= found.after.max_span + 1e-9
    if ranks == 8:  # at 0.5p on 8 ranks the limit forces recompute on rank 0, and that argument binds
        assert bound.argument == "forced recompute" and bound.ranks[0].recompute > bound.ranks[0].busy
