"""``pipeforge profile``: a real run of a small model on local gloo processes, and its refusals."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pipeforge.cli import main
from pipeforge.sim.costfile import read_cost_file

MODEL = str(Path(__file__).with_name("mlp_model.py"))


@pytest.mark.timeout(300)
@pytest.mark.parametrize("clock, pin", [("wall", []), ("cpu", ["--pin"])])
def test_profile_writes_a_cost_file_that_simulate_reads(tmp_path, capsys, clock, pin):
    out = tmp_path / "costs.json"
    assert main(["profile", MODEL, "--stages", "2", "--microbatches", "2", "--steps", "1", "--warmup", "0",
                 "--clock", clock, *pin, "-o", str(out)]) == 0
    assert "wrote" in capsys.readouterr().out
    data = json.loads(out.read_text())
    assert data["units"] == "ms" and len(data["stages"]) == 2 and len(data["links"]) == 1
    assert all(stage[k] > 0 for stage in data["stages"] for k in ("F", "I", "W", "B"))
    # stage 0, one microbatch of 16 rows: Linear saves its 16x256 input, Tanh its 16x64 output (float32)
    assert data["stages"][0]["activation"] == 16 * 256 * 4 + 16 * 64 * 4
    # what is held after I until W: on stage 0 all of it (its I does nothing); on stage 1 the Linear's
    # 16x64 input, which its W reads (Tanh's output and the loss's square's input I frees), and the 16x64
    # gradient I recorded at the Linear's output, where W starts
    assert data["stages"][0]["weight_grad"] == data["stages"][0]["activation"]
    assert data["stages"][1]["activation"] == 3 * 16 * 64 * 4 and data["stages"][1]["weight_grad"] == 2 * 16 * 64 * 4
    # a recompute: the forward again under autograd (R = F), keeping the stage's input: 16x256 float32 on stage 0
    assert all(stage["R"] == stage["F"] for stage in data["stages"])
    assert data["stages"][0]["checkpoint"] == 16 * 256 * 4
    assert 0 < data["stages"][1]["checkpoint"] <= data["stages"][1]["activation"]
    assert data["step"] >= 0 and data["dispatch"] >= 0 and len(data["chain_sum"]) == 2 and all(t > 0 for t in data["chain_sum"])
    found = read_cost_file(out)
    assert found.costs.overhead.step == data["step"]
    assert found.activation[0] == 1.0 and found.costs.links[0] == data["links"][0]
    assert main(["simulate", "1f1b", "-D", "P=2", "--costs", str(out), "--json"]) == 0


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="no CPU affinity on this platform")
def test_pin_to_core_keeps_each_rank_on_a_core_of_its_own_only_where_there_are_enough():
    script = ("import os\nfrom pipeforge.tools.profiling import pin_to_core\n"
              "cores = sorted(os.sched_getaffinity(0))\n"
              "print(pin_to_core(len(cores) + 1, len(cores) + 2), sorted(os.sched_getaffinity(0)) == cores)\n"
              "print(pin_to_core(len(cores) - 1, len(cores)), sorted(os.sched_getaffinity(0)) == cores[-1:])\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True,
                          env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])})
    assert done.stdout.split() == ["False", "True", "True", "True"]


def test_model_file_without_the_function_exits_2(tmp_path, capsys):
    model = tmp_path / "model.py"
    model.write_text("x = 1\n", encoding="utf-8")
    assert main(["profile", str(model), "--stages", "2", "--steps", "1", "--warmup", "0",
                 "-o", str(tmp_path / "c.json")]) == 2
    assert "defines no function pipeforge_model(stages)" in capsys.readouterr().err
    assert not (tmp_path / "c.json").exists()
    text = tmp_path / "model.txt"  # no module: before, each rank's AttributeError from importlib
    text.write_text("def pipeforge_model(stages):\n    pass\n", encoding="utf-8")
    assert main(["profile", str(text), "--stages", "2", "--steps", "1", "--warmup", "0",
                 "-o", str(tmp_path / "c.json")]) == 2
    assert "model.txt: not a Python module file" in capsys.readouterr().err


@pytest.mark.parametrize("argv", [["--stages", "1"], ["--stages", "2", "--steps", "0"]])
def test_bad_arguments_exit_2(tmp_path, argv):
    assert main(["profile", MODEL, *argv, "-o", str(tmp_path / "c.json")]) == 2


def test_missing_model_file_exits_2(tmp_path, capsys):
    assert main(["profile", str(tmp_path / "none.py"), "--stages", "2", "-o", str(tmp_path / "c.json")]) == 2
    assert "no such file" in capsys.readouterr().err


@pytest.mark.timeout(300)
@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="no CPU affinity on this platform")
def test_pin_says_when_it_cannot_pin(tmp_path):
    # the command's process (and so its ranks) may run on one core only: two ranks cannot have one each
    out = tmp_path / "costs.json"
    script = ("import os, sys\nfrom pipeforge.cli import main\n"
              "os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})\n"
              f"sys.exit(main(['profile', {MODEL!r}, '--stages', '2', '--microbatches', '2', '--steps', '1', "
              f"'--warmup', '0', '--pin', '-o', {str(out)!r}]))\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=280)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "warning: --pin: rank 0, 1 could not be kept on a core of its own (1 usable cores for 2 ranks" in done.stderr
    assert out.exists()
