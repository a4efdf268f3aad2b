"""``pipeforge optimize`` through the command line: report, JSON, the written file, errors."""

from __future__ import annotations

import io
import json

import pytest

import pipeforge
from pipeforge.cli import main
from pipeforge.commands.optimize import ProgressLine
from pipeforge.files import write_atomically
from pipeforge.ir import MemorySpec
from pipeforge.sim import simulate


def run_cli(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_writes_a_plain_pipe_that_loads_back(tmp_path, capsys):
    out = tmp_path / "zb.pipe"
    code, text, _ = run_cli(capsys, "optimize", "1f1b", "-D", "P=4", "-D", "M=8", "--memory-limit", "4",
                            "-o", str(out))
    assert code == 0
    assert "bubble rate" in text and "27.27%" in text and "11.11%" in text and "optimal" in text
    loaded = pipeforge.load(str(out))
    timeline = simulate(loaded)
    assert timeline.bubble_rate == pytest.approx(1 - 24 / 27)
    assert max(timeline.peak_memory) <= 4


def test_json_is_one_object(tmp_path, capsys):
    out = tmp_path / "o.pipe"
    code, text, _ = run_cli(capsys, "optimize", "1f1b", "-D", "P=3", "-D", "M=6", "--cost",
                            "F=1,I=1,W=1,comm=0.5", "--strategy", "greedy", "-o", str(out), "--json")
    assert code == 0
    data = json.loads(text)
    assert data["improved"] is True and data["found_by"] == "greedy" and data["output"] == str(out)
    assert data["after"]["bubble_rate"] < data["before"]["bubble_rate"]
    assert data["bound"]["bubble_rate"] <= data["after"]["bubble_rate"] + 1e-9
    assert 0.0 <= data["gap"] <= 1.0
    assert out.exists()


@pytest.mark.parametrize("argv", [
    ["--time-limit", "0"],
    ["--strategy", "greedy", "--memory-limit", "-1"],
    ["--cost", "F=x"],
])
def test_usage_errors_exit_2_and_write_nothing(tmp_path, capsys, argv):
    out = tmp_path / "never.pipe"
    code, text, err = run_cli(capsys, "optimize", "1f1b", "-D", "P=2", "-D", "M=2", "-o", str(out), *argv)
    assert code == 2 and text == "" and "error" in err
    assert not out.exists()


def test_greedy_on_a_bidirectional_schedule_is_a_usage_error(tmp_path, capsys):
    code, _, err = run_cli(capsys, "optimize", "chimera", "--strategy", "greedy", "-o", str(tmp_path / "x.pipe"))
    assert code == 2 and "one chain" in err


def test_impossible_memory_limit_exits_1(tmp_path, capsys):
    code, _, err = run_cli(capsys, "optimize", "1f1b", "-D", "P=2", "-D", "M=2", "--memory-limit", "0.5",
                           "-o", str(tmp_path / "x.pipe"))
    assert code == 1 and "memory limit" in err


def test_atomic_write_leaves_no_half_file(tmp_path):
    target = tmp_path / "a.pipe"
    write_atomically(target, "schedule a() {}\n")
    assert target.read_text() == "schedule a() {}\n"
    assert [p.name for p in tmp_path.iterdir()] == ["a.pipe"]


class _Stream(io.StringIO):
    def __init__(self, tty):
        super().__init__()
        self.tty = tty

    def isatty(self):
        return self.tty


@pytest.mark.parametrize("tty", [True, False])
def test_progress_waits_a_second_then_draws(tty):
    stream = _Stream(tty)
    progress = ProgressLine(stream, delay=0.0)
    progress(0.5, "local search")
    progress.close()
    text = stream.getvalue()
    assert "local search" in text
    assert ("[" in text and "\r" in text) if tty else text.startswith("optimize:")
    quiet = _Stream(tty)
    ProgressLine(quiet, delay=60.0)(0.5, "local search")
    assert quiet.getvalue() == ""


def test_a_search_longer_than_a_second_reports_progress_on_stderr(tmp_path):
    import subprocess
    import sys

    command = [sys.executable, "-m", "pipeforge", "optimize", "interleaved-1f1b", "-D", "M=16", "--strategy", "local",
               "--time-limit", "5", "-o", str(tmp_path / "o.pipe")]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "optimize:" in done.stderr and "local search" in done.stderr
    assert "\r" not in done.stderr  # not a terminal: plain lines, no bar


def test_exact_refuses_a_schedule_too_large_for_it_with_exit_2(tmp_path, capsys):
    out = tmp_path / "never.pipe"
    code, text, err = run_cli(capsys, "optimize", "1f1b", "-D", "P=8", "-D", "M=32", "--strategy", "exact",
                              "--time-limit", "2", "-o", str(out))
    assert code == 2 and text == "" and "--strategy exact" in err and "auto or local" in err
    assert not out.exists()


def test_the_json_and_the_report_say_why_the_search_stopped(tmp_path, capsys):
    out = tmp_path / "o.pipe"
    argv = ["optimize", "1f1b", "-D", "P=4", "-D", "M=8", "--memory-limit", "4", "-o", str(out)]
    code, text, _ = run_cli(capsys, *argv, "--json")
    data = json.loads(text)
    assert code == 0 and data["optimal"] and data["stopped"] == "bound"
    assert "lower bound" in data["stopped_because"]
    code, text, _ = run_cli(capsys, *argv)
    assert "stopped: the best order reaches the proven lower bound" in text


def test_cost_weights_sets_the_part_of_memory_only_w_releases(tmp_path, capsys):
    out = tmp_path / "o.pipe"
    peaks = {}
    for weights in ("0.25", "0.5"):
        code, text, _ = run_cli(capsys, "optimize", "zb-h1", "-D", "P=4", "-D", "M=8", "--strategy", "greedy",
                                "--cost", f"F=1,I=1,W=1,weights={weights}", "-o", str(out), "--json")
        assert code == 0
        peaks[weights] = json.loads(text)["before"]["peak_memory"]
        assert (pipeforge.load(str(out)).memory or MemorySpec()).weights == float(weights)
    assert peaks["0.25"] != peaks["0.5"]


# (weights above 1 are allowed, as everywhere: test_sim_weight_grad)
@pytest.mark.parametrize("item", ["weights=inf", "weights=x", "weights=-0.5"])
def test_bad_weights_are_usage_errors(tmp_path, capsys, item):
    code, text, err = run_cli(capsys, "optimize", "1f1b", "-D", "P=2", "-D", "M=2", "--cost", item,
                              "-o", str(tmp_path / "never.pipe"))
    assert code == 2 and text == "" and "weights" in err


# measured costs where the fused B is cheaper than I + W (per stage, one link slower)
FUSED_CHEAPER = {"units": "ms", "links": [0.1, 0.1, 0.1],
                 "stages": [{"F": 3.1, "I": 2.9, "W": 2.2, "B": 4.0}, {"F": 3.0, "I": 3.0, "W": 2.1, "B": 4.1},
                            {"F": 3.1, "I": 2.9, "W": 2.2, "B": 4.0}, {"F": 3.2, "I": 3.1, "W": 2.4, "B": 4.6}]}


def test_with_b_cheaper_than_i_plus_w_after_never_reads_below_the_bound(tmp_path, capsys):
    """A schedule that splits some B does more compute than the least work, so simulate's bubble rate of
    "after" reads lower than on the least work (it can fall below the bound's); the report compares spans
    and counts every bubble on the least work."""
    costs = tmp_path / "costs.json"
    costs.write_text(json.dumps(FUSED_CHEAPER), encoding="utf-8")
    argv = ["optimize", "1f1b", "-D", "P=4", "-D", "M=8", "--costs", str(costs), "--strategy", "greedy",
            "-o", str(tmp_path / "o.pipe")]
    code, text, _ = run_cli(capsys, *argv, "--json")
    data = json.loads(text)
    before, after, bound = data["before"], data["after"], data["bound"]
    assert code == 0 and data["improved"] and "least compute" in data["least_work"]
    assert after["bubble_rate"] < after["least_work_bubble_rate"]  # simulate's own rate: it splits some B
    assert after["max_span"] >= bound["max_span"] and after["least_work_bubble_rate"] >= bound["bubble_rate"]
    least = sum(8 * (s["F"] + min(s["B"], s["I"] + s["W"])) for s in FUSED_CHEAPER["stages"]) / 4
    for figures in (before, after):
        assert figures["least_work_bubble_rate"] == pytest.approx(1 - least / figures["max_span"])
    assert bound["least_work_bubble_rate"] == bound["bubble_rate"] == pytest.approx(1 - least / bound["max_span"])
    code, text, _ = run_cli(capsys, *argv)
    rows = {line[:13].strip(): line for line in text.splitlines()}
    assert rows["worst span"].split()[2:5] == [f"{before['max_span']:.4g}", f"{after['max_span']:.4g}",
                                               f"{bound['max_span']:.4g}"]
    assert f"{100 * after['least_work_bubble_rate']:.2f}%" in rows["bubble rate"] and "least work" in rows["bubble rate"]
    assert f"{100 * after['bubble_rate']:.2f}%" in rows["(simulate)"]


def test_with_b_equal_to_i_plus_w_the_two_bubble_rates_agree(tmp_path, capsys):
    code, text, _ = run_cli(capsys, "optimize", "1f1b", "-D", "P=4", "-D", "M=8", "--strategy", "greedy",
                            "-o", str(tmp_path / "o.pipe"), "--json")
    data = json.loads(text)
    for figures in (data["before"], data["after"]):
        assert figures["least_work_bubble_rate"] == pytest.approx(figures["bubble_rate"])
    code, text, _ = run_cli(capsys, "optimize", "1f1b", "-D", "P=4", "-D", "M=8", "--strategy", "greedy",
                            "-o", str(tmp_path / "o.pipe"))
    assert "(simulate)" not in text
