"""What ``benchmarks/profile/loop.py`` builds besides the library: the hand-built order is a valid
schedule, and its step time is what the cost model says."""

from __future__ import annotations

import importlib
import json

import pytest

from pipeforge import loads, verify
from pipeforge.sim import simulate
from pipeforge.sim.costfile import with_cost_file



@pytest.fixture(scope="module")
def bench():
    return importlib.import_module("benchmarks.profile.loop")


@pytest.mark.parametrize("microbatches", [3, 8])
def test_deferred_w_is_valid_and_within_1p(bench, microbatches, tmp_path):
    schedule = loads(bench.deferred_w(2, microbatches))
    assert verify(schedule).valid
    costs = tmp_path / "c.json"
    costs.write_text(json.dumps({"stages": [{"F": 9, "I": 0.1, "W": 17.4, "B": 17.5, "activation": 98},
                                            {"F": 9, "I": 9, "W": 9.3, "B": 15.9, "activation": 100}],
                                 "links": [0.05], "step": 1.5}))
    timeline = simulate(with_cost_file(schedule, costs))
    assert max(timeline.peak_memory) <= 2.0  # at most 1p (P = 2 microbatches of the largest stage)
    assert timeline.step_time == pytest.approx(timeline.makespan + 1.5)


def test_spearman_and_in_situ_costs(bench):
    assert bench.spearman([1, 2, 3], [10, 20, 30]) == pytest.approx(1.0)
    assert bench.spearman([1, 2, 3], [30, 20, 10]) == pytest.approx(-1.0)
    from pipeforge.runtime.step_trace import Trace, TraceEvent

    trace = Trace(0, (TraceEvent("step", None, None, 0, 0.0, 0.020, 0.02),
                      TraceEvent("program", None, None, 0, 0.001, 0.019, 0.018),
                      TraceEvent("F", 0, 0, 0, 0.002, 0.010, 0.008),
                      TraceEvent("B", 0, 0, 0, 0.010, 0.018, 0.008)))
    profiled = {"units": "ms", "stages": [{"F": 1.0, "I": 1.0, "W": 1.0, "B": 2.0, "activation": 5.0}], "links": []}
    situ = bench.in_situ_costs(profiled, [trace], [trace])
    assert situ["stages"][0] == {"F": 8.0, "I": 1.0, "W": 1.0, "B": 8.0, "activation": 5.0}
    assert situ["step"] == pytest.approx(2.0) and situ["dispatch"] == pytest.approx(1.0)


def test_gpt_blocks_lays_out_the_stages(monkeypatch):
    gpt = importlib.import_module("benchmarks.profile.gpt_unequal")
    assert gpt.blocks_per_stage(3) == [gpt.BLOCKS_PER_STAGE] * 3
    monkeypatch.setenv("GPT_BLOCKS", "1,3")
    model = gpt.pipeforge_model(2)
    assert [len(stage.blocks) for stage in model["modules"]] == [1, 3]
    assert model["modules"][0].embed is not None and model["modules"][1].head is not None
    with pytest.raises(ValueError, match="expected 3 counts"):
        gpt.blocks_per_stage(3)


def test_median_interval_and_sign_test(bench):
    assert bench.median_interval([float(x) for x in range(1, 61)]) == (22.0, 39.0)  # the tables' k for n = 60
    assert bench.median_interval([3.0, 1.0, 2.0]) == (1.0, 3.0)  # too few rounds: the whole range
    assert bench.sign_test(3, 3) == pytest.approx(1 / 8)
    assert bench.sign_test(0, 10) == pytest.approx(1.0)


def test_the_gpt_as_one_layer_list_is_what_split_cuts(monkeypatch):
    """The plan arm's GPT: ``pipeforge.split`` of the whole model checks its stages chained equal it."""
    import pipeforge

    gpt = importlib.import_module("benchmarks.profile.gpt_unequal")
    monkeypatch.setenv("PLAN_LAYERS", "3")
    found = gpt.pipeforge_layers()
    cut = pipeforge.split(found["model"], 2, layers=[1, 2])  # verify=True: chained stages == the model
    assert [len(cut.modules[s].blocks) for s in (0, 1)] == [1, 2]
    assert hasattr(cut.modules[0], "embed") and hasattr(cut.modules[1], "head")


@pytest.mark.distributed
@pytest.mark.timeout(300)
def test_timing_a_layer_map_cuts_the_model_files_whole_model(tmp_path):
    """``TimingJob(layers=...)``: each module's pipeline built from ``pipeforge_layers()`` cut as its map says."""
    from pathlib import Path

    from pipeforge.generator import codegen
    from pipeforge.library import load_library_schedule
    from pipeforge.tools.launch import spawn
    from pipeforge.tools.step_timing import TimingJob

    model = str(Path(__file__).with_name("layer_model.py"))
    paths = []
    for index in range(2):
        (tmp_path / str(index)).mkdir()
        paths.append(str(codegen(load_library_schedule("1f1b", {"P": 2, "M": 4}), str(tmp_path / str(index)))))
    job = TimingJob(model, tuple(paths), steps=2, warmup=1, layers=((3, 1), (2, 2)))
    outcomes = spawn("pipeforge.tools.step_timing:time_schedules", 2, job, timeout=120, deadline=280)
    assert all(o.ok for o in outcomes), [o.error for o in outcomes if not o.ok]
    assert all(len(steps) == 2 and min(steps) > 0 for steps in outcomes[0].value["steps_ms"])
