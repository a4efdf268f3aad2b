"""--placement: the optimizer lays the stages out anew (loop, V, interleaved) and says which it chose."""

from __future__ import annotations

import json

import pytest

import pipeforge
from pipeforge.cli import main
from pipeforge.errors import UsageError
from pipeforge.ir import CostModel, Placement
from pipeforge.optimizer import optimize
from pipeforge.optimizer.evaluate import Problem
from pipeforge.optimizer.placement import Layout, chunk_costs, layouts
from pipeforge.optimizer.v_greedy import supports as v_supports
from pipeforge.sim import simulate
from pipeforge.verifier import verify

ZB_1_5B = CostModel(F=18.522, I=18.086, W=9.337, comm=0.601)
AUTHORS_ZB_V = 0.07027  # the authors' zbv.py on this profile, m = 24, 1p, timed by pipeforge's evaluator


def problem_of(name, **defines):
    return Problem.of(pipeforge.load(name, defines=defines))


def test_any_tries_the_input_v_and_interleaved_and_drops_a_repeat_of_the_input():
    found = layouts("any", problem_of("1f1b", P=4, M=8))
    assert found == [Layout("keep"), Layout("v", 2), Layout("loop", 2)]


def test_loop_from_a_v_schedule_is_loop_order_and_from_loop_the_input_itself():
    assert layouts("loop", problem_of("1f1b", P=4, M=8)) == [Layout("keep")]
    assert layouts("loop", problem_of("zbv")) == [Layout("loop")]


@pytest.mark.parametrize(("name", "choice"), [("chimera", "v"), ("1f1b", "nonsense")])
def test_layouts_that_cannot_be_are_usage_errors(name, choice):
    with pytest.raises(UsageError):
        layouts(choice, problem_of(name))


def test_chunks_divide_compute_and_keep_the_transfer():
    costs = CostModel(F=2.0, I=4.0, W=1.0, B=5.0, comm=0.5, per_stage=((1, "F", 6.0),))
    half = chunk_costs(costs, 2)
    assert (half.F, half.I, half.W, half.B, half.comm) == (1.0, 2.0, 0.5, 2.5, 0.5)
    assert half.per_stage == ((2, "F", 3.0), (3, "F", 3.0))


def test_chunks_keep_a_links_latency_between_the_stages_it_joined():
    half = chunk_costs(CostModel(comm=0.5, links=(0.25, 0.75)), 2)
    assert half.links == (0.5, 0.25, 0.5, 0.75)


def test_a_v_layout_is_what_the_v_scheduler_expects():
    base = problem_of("1f1b", P=4, M=8)
    v = Layout("v", 2).problem(replace_limit(base, 4.0))
    assert v.stages == 8 and v.placements == (Placement.v(8, 4),) and v.memory_limit == 8.0
    assert v_supports(v)


def replace_limit(problem, limit):
    from dataclasses import replace
    return replace(problem, memory_limit=limit)


@pytest.mark.parametrize("choice", ["v", "interleaved"])
def test_a_new_layout_is_valid_fits_and_reports_as_it_simulates(choice):
    schedule = pipeforge.load("1f1b", defines={"P": 4, "M": 8})
    result = optimize(schedule, costs=CostModel(comm=0.1), memory_limit=4.0, placement=choice,
                      strategy="greedy")
    out = result.schedule
    assert out.stages == 8 and result.placement.endswith("2 stages a rank")
    assert verify(out, memory_limit=out.memory.limit).valid
    timeline = simulate(out)
    assert timeline.bubble_rate == pytest.approx(result.after.bubble_rate)
    assert max(timeline.peak_memory) / 2 <= 4.0 + 1e-9   # chunk units -> the input's M_B
    assert max(result.after.peak_memory) <= 4.0 + 1e-9
    assert out.costs.F == pytest.approx(0.5) and out.costs.comm == pytest.approx(0.1)


def test_any_from_1f1b_at_1p_reaches_the_authors_zb_v():
    # The issue: from 1F1B with the 1.5B profile at 1p memory, a V placement (ZB-V .0703)
    # beats what one stage a rank can do (ZB-1p .1585).
    schedule = pipeforge.load("1f1b", defines={"P": 8, "M": 24})
    result = optimize(schedule, costs=ZB_1_5B, memory_limit=8.0, placement="any", strategy="greedy",
                      weights=0.366)
    assert result.placement == "v, 2 stages a rank"
    assert result.after.bubble_rate <= AUTHORS_ZB_V + 5e-6
    assert max(result.after.peak_memory) <= 8.0 + 1e-9


def test_keep_never_changes_the_placement():
    schedule = pipeforge.load("1f1b", defines={"P": 4, "M": 8})
    result = optimize(schedule, memory_limit=4.0, strategy="greedy")
    assert result.schedule.placements == schedule.placements and result.placements_tried == ("keep (the input's)",)


def test_the_command_line_reports_the_chosen_placement(tmp_path, capsys):
    out = tmp_path / "v.pipe"
    code = main(["optimize", "1f1b", "-D", "P=4", "-D", "M=8", "--memory-limit", "4", "--placement", "any",
                 "--strategy", "greedy", "-o", str(out), "--json"])
    data = json.loads(capsys.readouterr().out)
    assert code == 0 and data["placement"]["chosen"] in data["placement"]["tried"]
    assert len(data["placement"]["tried"]) == 3 and "placed" in data["bound"]["of"]
    assert pipeforge.load(str(out)).stages == data["placement"]["stages"]


def test_any_bounds_every_layout_and_builds_the_most_promising_first_within_the_time_limit():
    # Past the time limit no further layout gets greedy orders once one has: with a limit far shorter than
    # one build, only the layout with the lowest bound (the V, at 1p) is built, and it still wins.
    schedule = pipeforge.load("1f1b", defines={"P": 8, "M": 24})
    result = optimize(schedule, costs=ZB_1_5B, memory_limit=8.0, placement="any", strategy="greedy",
                      weights=0.366, time_limit=0.01)
    assert result.placement == "v, 2 stages a rank" and result.found_by == "greedy-v"
    assert len(result.placements_tried) == 3  # each was bounded (the bound covers them all)
    assert result.after.bubble_rate <= AUTHORS_ZB_V + 5e-6


def test_any_skips_a_layout_whose_bound_another_layouts_order_reaches(monkeypatch):
    # At 1p the V order (ZB-V's .0703) is below the one-stage-a-rank bound (ZB-1p's .1585, proven):
    # the Zero Bubble builder for the input's own layout need not run, whatever the time limit.
    from pipeforge.optimizer import greedy

    calls = []
    original = greedy.best_zero_bubble_order
    monkeypatch.setattr(greedy, "best_zero_bubble_order", lambda *a, **k: calls.append(a) or original(*a, **k))
    schedule = pipeforge.load("1f1b", defines={"P": 8, "M": 24})
    result = optimize(schedule, costs=ZB_1_5B, memory_limit=8.0, placement="any", strategy="greedy",
                      weights=0.366, time_limit=60.0)
    assert result.placement == "v, 2 stages a rank" and calls == []
