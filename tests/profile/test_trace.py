"""``pipeline.trace``: per-action timings of real steps on 2 gloo ranks, and what is made of them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipeforge.generator import codegen
from pipeforge.library import load_library_schedule
from pipeforge.tools.launch import spawn
from pipeforge.tools.step_timing import TimingJob
from pipeforge.runtime.step_trace import COMPUTE, Trace, TraceEvent, chrome_events, compute_costs

MODEL = str(Path(__file__).with_name("mlp_model.py"))
SCHEDULES = ("zb-h1", "1f1b")


@pytest.fixture(scope="module")
def traced(tmp_path_factory):
    """Two measured steps of ZB-H1 and 1F1B (P=2, M=4), traced on both ranks."""
    out = tmp_path_factory.mktemp("trace")
    schedules = [load_library_schedule(name, {"P": 2, "M": 4}) for name in SCHEDULES]
    paths = []
    for index, schedule in enumerate(schedules):
        (out / str(index)).mkdir()
        paths.append(str(codegen(schedule, str(out / str(index)))))
    outcomes = spawn("pipeforge.tools.step_timing:time_schedules", 2,
                     TimingJob(MODEL, tuple(paths), steps=2, warmup=1, trace=True), timeout=120, deadline=300)
    assert all(o.ok for o in outcomes), [o.error for o in outcomes if not o.ok]
    ordered = sorted(outcomes, key=lambda o: o.rank)
    traces = {name: [[Trace.from_json(t) for t in o.value["traces"][i]] for o in ordered]
              for i, name in enumerate(SCHEDULES)}
    return schedules, traces, ordered[0].value


@pytest.mark.timeout(300)
def test_one_compute_event_per_action_of_the_program_in_order(traced):
    schedules, traces, _ = traced
    for schedule, name in zip(schedules, SCHEDULES):
        for rank in range(2):
            expected = [(a.kind.value, a.stage, a.microbatch) for step in schedule.programs[rank]
                        for a in step.actions if a.kind.value in COMPUTE]
            assert len(traces[name][rank]) == 2  # one trace per measured step
            for trace in traces[name][rank]:
                assert trace.rank == rank
                compute = sorted(trace.of_kind(*COMPUTE), key=lambda e: e.start)
                assert [(e.kind, e.stage, e.microbatch) for e in compute] == expected
                for before, after in zip(compute, compute[1:]):  # one thread: compute never overlaps
                    assert before.end <= after.start


@pytest.mark.timeout(300)
def test_events_are_sane_and_ranks_share_one_clock(traced):
    _, traces, _ = traced
    for name in SCHEDULES:
        for step in range(2):
            ranks = [traces[name][rank][step] for rank in range(2)]
            for trace in ranks:
                (whole,) = trace.of_kind("step")
                (program,) = trace.of_kind("program")
                assert whole.start <= program.start and program.end <= whole.end
                assert trace.outside() == pytest.approx(whole.duration - program.duration)
                assert 0 <= trace.dispatch() <= program.duration / len(trace.of_kind(*COMPUTE))
                assert trace.dispatch("cpu") >= 0
                for event in trace.events:
                    assert event.start <= event.end and event.cpu >= 0
                    assert whole.start <= event.start and event.end <= whole.end
                    assert event.cpu <= event.duration + 2e-3  # a thread's CPU fits in its wall time
                waits = trace.of_kind("RECV_F", "RECV_B")
                assert {e.kind for e in waits} == ({"RECV_F"} if trace.rank == 1 else {"RECV_B"})
                assert trace.of_kind("post") and all(e.label for e in trace.of_kind("post"))
                parts = trace.breakdown()
                assert parts.actions == len(trace.of_kind(*COMPUTE))
                assert parts.step == pytest.approx(parts.outside + parts.compute + parts.waits + parts.posts
                                                   + parts.between)
                assert parts.compute > 0 and parts.outside >= 0 and parts.between >= -1e-6
                assert all(program.start <= e.start and e.end <= program.end for e in trace.events
                           if e.kind not in ("step", "program"))
            # a stage-1 forward starts only after stage 0's forward of the same microbatch ended on rank 0
            first = {e.microbatch: e for e in ranks[0].of_kind("F")}
            for event in ranks[1].of_kind("F"):
                assert event.start >= first[event.microbatch].end


@pytest.mark.timeout(300)
def test_compute_costs_and_step_times(traced):
    _, traces, value = traced
    every = [t for name in SCHEDULES for rank in traces[name] for t in rank]
    costs = compute_costs(every)
    ran = {"F", "B", "I", "W"}  # what 1F1B and ZB-H1 run: no recompute among them
    assert set(costs) == {0, 1} and all(set(costs[s]) == ran for s in costs)
    assert all(v > 0 for s in costs for v in costs[s].values())
    assert set(compute_costs(every, clock="cpu")) == {0, 1}
    assert len(value["steps_ms"]) == 2 and all(len(s) == 2 for s in value["steps_ms"])
    assert value["ms"] == [sorted(s)[0] + (sorted(s)[1] - sorted(s)[0]) / 2 for s in value["steps_ms"]]
    events = chrome_events([traces["zb-h1"][r][0] for r in range(2)], pid=1, name="measured zb-h1")
    assert json.loads(json.dumps(events))[0]["args"]["name"] == "measured zb-h1"
    timed = [e for e in events if e["ph"] == "X"]
    assert min(e["ts"] for e in timed) >= 0 and {e["tid"] for e in timed} == {0, 1}  # from the first step start


def test_trace_round_trips_through_json():
    event = TraceEvent("F", 0, 3, 0, 1.0, 1.5, 0.4)
    trace = Trace(1, (event, TraceEvent("step", None, None, 0, 0.5, 2.0, 1.0)))
    assert Trace.from_json(json.loads(json.dumps(trace.to_json()))) == trace
    assert trace.breakdown().outside == pytest.approx(1.0) and trace.breakdown().per_action == 0.0


@pytest.mark.timeout(300)
def test_an_untraced_pipeline_keeps_no_trace():
    outcomes = spawn(untraced_step, 2, None, timeout=60, deadline=180)
    assert all(o.ok for o in outcomes), [o.error for o in outcomes if not o.ok]
    assert [o.value for o in outcomes] == [((), None, True)] * 2


def untraced_step(rank: int, nproc: int, _payload) -> tuple:
    import tempfile

    import torch

    from pipeforge.tools.generated import load_module
    from pipeforge.tools.profiling import load_model

    model = load_model(MODEL, 2)
    with tempfile.TemporaryDirectory() as out:  # make_pipeline reads the rank's module from there
        generated = load_module(str(codegen(load_library_schedule("1f1b", {"P": 2, "M": 2}), out)))
        pipe = generated.make_pipeline({rank: model["modules"][rank]}, loss_fn=model["loss_fn"], timeout=60)
    used = pipe._observers()  # none: the untraced context reads no clock
    pipe.step(*((model["batch"],) if rank == 0 else ()), target=model["target"] if rank == 1 else None)
    untraced = pipe.last_trace
    pipe.trace = True
    pipe.step(*((model["batch"],) if rank == 0 else ()), target=model["target"] if rank == 1 else None)
    return used, untraced, isinstance(pipe.last_trace, Trace) and torch.is_grad_enabled()
