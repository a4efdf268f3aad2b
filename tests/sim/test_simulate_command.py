"""``pipeforge simulate`` through the command line: human report, JSON contract, exit codes."""

from __future__ import annotations

import json

import pytest

from pipeforge.cli import main


@pytest.fixture
def csv_1f1b(tmp_path):
    path = tmp_path / "two.csv"
    path.write_text("0F0,0F1,0B0,0B1\n1F0,1B0,1F1,1B1\n", encoding="utf-8")
    return str(path)


def test_json_is_one_object_with_the_contract_fields(csv_1f1b, capsys):
    assert main(["simulate", csv_1f1b, "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["makespan"] == 9.0
    assert document["peak_memory"] == [2.0, 1.0]
    assert document["lower_bound"] == 9.0
    assert [r["busy"] for r in document["ranks"]] == [6.0, 6.0]


def test_cost_flag_overrides_and_comm_shifts(csv_1f1b, capsys):
    assert main(["simulate", csv_1f1b, "--json", "--cost", "comm=0.5"]) == 0
    assert json.loads(capsys.readouterr().out)["makespan"] == 10.0


def test_human_report_has_figures_bounds_memory_and_grid(csv_1f1b, capsys):
    assert main(["simulate", csv_1f1b, "--width", "40"]) == 0
    out = capsys.readouterr().out
    for text in ("makespan     9", "lower bound 9", "bubble rate  33.33%", "r0: 2  r1: 1", "rank 0 |F0", "rank 1 |"):
        assert text in out


def test_cost_flags_given_again_add_their_items(csv_1f1b, capsys):
    assert main(["simulate", csv_1f1b, "--json", "--cost", "F=2", "--cost", "comm=0.5"]) == 0
    twice = json.loads(capsys.readouterr().out)
    assert main(["simulate", csv_1f1b, "--json", "--cost", "F=2,comm=0.5"]) == 0
    assert twice == json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("flags, message", [
    (["--cost", "F=1,F=2"], "--cost item 'F=2': F is given twice, first as 'F=1'"),
    (["--cost", "F=1", "--cost", "I=3,F=2"], "--cost item 'F=2': F is given twice, first as 'F=1'"),
    (["--cost", "weights=0.2,weights=0.3"], "--cost item 'weights=0.3': weights is given twice"),
    (["-D", "P=2", "-D", "P=3"], "-D 'P=3': P is given twice, first as -D 'P=2'"),
    (["--memory-limit", "4", "--memory-limit", "8"], "argument --memory-limit: given twice, first 4.0, then 8.0"),
    (["--width", "-1"], "--width -1: expected 0 to 10000"),
])
def test_a_flag_given_twice_or_out_of_range_is_refused_not_last_wins(flags, message, capsys):
    """Each of these took the last value silently (or clamped --width -1 where show refused it)."""
    try:
        code = main(["simulate", "1f1b", *flags])
    except SystemExit as exit_:  # argparse's own refusal
        code = exit_.code
    captured = capsys.readouterr()
    assert (code, captured.out) == (2, "")
    assert message in captured.err and "Traceback" not in captured.err


def test_width_zero_is_the_default_as_in_show(csv_1f1b, capsys):
    assert main(["simulate", csv_1f1b, "--width", "0"]) == 0
    zero = capsys.readouterr().out
    assert main(["simulate", csv_1f1b]) == 0
    assert zero == capsys.readouterr().out


def test_library_schedule_with_defines(capsys):
    assert main(["simulate", "zb-h1", "-D", "P=4", "-D", "M=8", "--json", "--memory-limit", "4"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["bubble_rate"] == pytest.approx(3 / 27)
    assert document["memory"]["within_limit"] is True
    assert document["bounds"]["memory"] == pytest.approx(27)


@pytest.mark.parametrize("flags", [["--cost", "F=x"], ["--cost", "Q=1"], ["--memory-limit", "0"]])
def test_bad_flags_exit_2_with_a_message(csv_1f1b, capsys, flags):
    assert main(["simulate", csv_1f1b, *flags]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and "error:" in captured.err


def test_inconsistent_order_exits_1(tmp_path, capsys):
    path = tmp_path / "bad.csv"
    path.write_text("0B0,0F0\n1F0,1B0\n", encoding="utf-8")
    assert main(["simulate", str(path), "--microbatches", "1"]) == 1
    assert "cannot finish" in capsys.readouterr().err


# measured costs where the fused B is cheaper than I + W (as tests/optimize/test_optimize_command.py)
FUSED_CHEAPER = {"units": "ms", "stages": [{"F": 3.1, "I": 2.9, "W": 2.2, "B": 4.0}, {"F": 3.0, "I": 3.0, "W": 2.1, "B": 4.1},
                                          {"F": 3.1, "I": 2.9, "W": 2.2, "B": 4.0}, {"F": 3.2, "I": 3.1, "W": 2.4, "B": 4.6}]}


@pytest.mark.parametrize("name", ["1f1b", "zb-h1", "gpipe"])
def test_work_bound_gap_counts_the_schedule_on_the_bounds_own_work(tmp_path, capsys, name):
    """Where B < I + W a split schedule's own bubble rate counts more work than the bound does, so it can
    read below the bound; the gap is taken from the rate on the bound's (least) work, never negative."""
    costs = tmp_path / "costs.json"
    costs.write_text(json.dumps(FUSED_CHEAPER), encoding="utf-8")
    argv = ["simulate", name, "-D", "P=4", "-D", "M=8", "--costs", str(costs)]
    assert main([*argv, "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    spans = [r["end"] - r["start"] for r in document["ranks"]]
    least = sum(8 * (s["F"] + min(s["B"], s["I"] + s["W"])) for s in FUSED_CHEAPER["stages"]) / 4
    on_least_work = 1 - least / max(spans)
    assert document["least_work_bubble_rate"] == pytest.approx(on_least_work)
    assert on_least_work >= document["bounds"]["work"]["bubble_rate"] - 1e-9
    assert main(argv) == 0
    out = capsys.readouterr().out
    gap = float(out.split("[any schedule")[0].rsplit("gap ", 1)[1].split(" points")[0])
    assert gap == pytest.approx(100 * (on_least_work - document["bounds"]["work"]["bubble_rate"]), abs=0.006)
    assert gap >= 0
    splits = name == "zb-h1"
    assert ("this schedule on that work" in out) is splits
    if splits:
        assert document["bubble_rate"] < on_least_work - 1e-3  # the schedule's own rate counts I + W
