"""Chrome / Perfetto trace export of a timeline."""

from __future__ import annotations

import json

import pipeforge
from pipeforge.interop.chrome_trace import trace_events, write_trace
from pipeforge.ir import CostModel
from pipeforge.sim import simulate
from tests.sim.sim_orders import one_f_one_b


def test_one_x_event_per_action_on_the_ranks_thread():
    timeline = simulate(pipeforge.load("zb-h1", defines={"P": 4, "M": 8}))
    events = [e for e in trace_events(timeline) if e["ph"] == "X"]
    assert len(events) == 4 * 8 * 3
    first = next(e for e in events if e["name"] == "1I3")
    assert first["tid"] == 1 and first["pid"] == 0 and first["cat"] == "I"
    assert first["args"]["stage"] == 1 and first["args"]["microbatch"] == 3
    names = {e["args"]["name"] for e in trace_events(timeline) if e["name"] == "thread_name"}
    assert names == {"rank 0", "rank 1", "rank 2", "rank 3"}


def test_times_are_cost_units_as_milliseconds():
    timeline = simulate(one_f_one_b(2, 2), CostModel(F=1.5, I=1, W=1))
    event = next(e for e in trace_events(timeline) if e["name"] == "1F0")
    assert (event["ts"], event["dur"]) == (1500.0, 1500.0)


def test_write_trace_from_a_schedule_loads_back(tmp_path):
    path = tmp_path / "t.json"
    write_trace(one_f_one_b(3, 4), str(path), costs=CostModel(comm=0.5))
    document = json.loads(path.read_text(encoding="utf-8"))
    assert len([e for e in document["traceEvents"] if e["ph"] == "X"]) == 24
    assert document["otherData"]["makespan"] == simulate(one_f_one_b(3, 4), CostModel(comm=0.5)).makespan
