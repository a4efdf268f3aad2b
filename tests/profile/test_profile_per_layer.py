"""``pipeforge profile --per-layer``: each layer of a split model measured, in the file ``pipeforge plan`` reads."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipeforge.cli import main

MODEL = str(Path(__file__).with_name("layer_model.py"))
FLOAT = 4  # bytes


@pytest.mark.timeout(300)
def test_per_layer_costs_are_measured_and_plan_reads_them(tmp_path, capsys):
    out = tmp_path / "layers.json"
    assert main(["profile", MODEL, "--per-layer", "--repeats", "2", "-o", str(out)]) == 0
    assert "wrote" in capsys.readouterr().out
    data = json.loads(out.read_text())
    assert data["units"] == "ms" and len(data["layers"]) == 4
    for layer in data["layers"]:
        assert all(layer[k] > 0 for k in ("F", "I", "W")), layer
        assert layer["parameters"] == (64 * 64 + 64) * FLOAT, layer  # the block's Linear
        assert layer["activation"] >= 16 * 64 * FLOAT, layer  # at least the Linear's input
    assert data["first"]["parameters"] == (8 * 64 + 64) * FLOAT  # the embedding, beyond layer 0
    assert data["last"]["parameters"] == (64 * 512 + 512) * FLOAT  # the head, beyond the last layer
    plan = tmp_path / "plan.pipe"
    assert main(["plan", str(out), "--ranks", "2", "--microbatches", "4", "-o", str(plan), "--json"]) == 0
    chosen = json.loads(capsys.readouterr().out)
    assert sum(chosen["layers"]) == 4 and len(chosen["layers"]) == 2, chosen
    assert plan.exists() and main(["verify", str(plan)]) == 0


def test_per_layer_refusals_name_the_problem(tmp_path, capsys):
    bare = tmp_path / "bare.py"
    bare.write_text("x = 1\n")
    out = str(tmp_path / "layers.json")
    assert main(["profile", str(bare), "--per-layer", "-o", out]) == 2
    assert "defines no function pipeforge_layers()" in capsys.readouterr().err
    assert main(["profile", MODEL, "--per-layer", "--stages", "2", "-o", out]) == 2
    assert "leave --stages out" in capsys.readouterr().err
    assert main(["profile", MODEL, "-o", out]) == 2
    assert "--stages N is required" in capsys.readouterr().err
    assert not Path(out).exists()
