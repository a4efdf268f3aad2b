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
    text = tmp_path / "layers.txt"  # no module: before, an AttributeError from importlib (exit 70)
    text.write_text("def pipeforge_layers():\n    pass\n")
    assert main(["profile", str(text), "--per-layer", "-o", out]) == 2
    assert "layers.txt: not a Python module file" in capsys.readouterr().err
    assert main(["profile", MODEL, "--per-layer", "--stages", "2", "-o", out]) == 2
    assert "leave --stages out" in capsys.readouterr().err
    assert main(["profile", MODEL, "-o", out]) == 2
    assert "--stages N is required" in capsys.readouterr().err
    assert not Path(out).exists()


def test_stage_zeros_extra_counts_its_layers_input_backward_once():
    """Stage 0's inputs need no gradient: its I does nothing and its W runs the whole backward, its layer's I
    included; the embedding's extra is the difference of the backward sums (before: W minus the layer's W
    alone, which counted the layer's I twice on stage 0)."""
    from pipeforge.models.profile import _first_extra

    layer = {"F": 1.0, "I": 1.0, "W": 1.0}
    assert _first_extra({"F": 3.0, "I": 0.0, "W": 5.0}, layer) == {"F": 2.0, "I": 0.0, "W": 3.0}
    assert _first_extra({"F": 0.5, "I": 0.0, "W": 1.5}, layer) == {"F": 0.0, "I": 0.0, "W": 0.0}


@pytest.mark.timeout(300)
def test_per_layer_with_microbatches_times_one_microbatchs_rows(tmp_path, capsys):
    """``--microbatches 4`` times each layer on a quarter of the file's 16 rows: the Linear's saved input is a
    quarter as large (bytes, not times: steady under load); more microbatches than rows is refused."""
    whole, quarter = tmp_path / "whole.json", tmp_path / "quarter.json"
    assert main(["profile", MODEL, "--per-layer", "--repeats", "1", "-o", str(whole)]) == 0
    assert main(["profile", MODEL, "--per-layer", "--repeats", "1", "--microbatches", "4", "-o", str(quarter)]) == 0
    capsys.readouterr()
    for big, small in zip(json.loads(whole.read_text())["layers"], json.loads(quarter.read_text())["layers"]):
        assert small["activation"] * 4 == big["activation"], (small, big)
        assert small["parameters"] == big["parameters"]
    out = tmp_path / "none.json"
    assert main(["profile", MODEL, "--per-layer", "--microbatches", "17", "-o", str(out)]) == 2
    assert "--microbatches 17: the model file's batch has only 16 rows" in capsys.readouterr().err
    assert not out.exists()
