"""``pipeforge plan``: layers per stage and the schedule from per-layer costs, against the even split."""

from __future__ import annotations

import json

import pytest

import pipeforge
from pipeforge.cli import main
from pipeforge.errors import UsageError
from pipeforge.plan import even, layer_costs_from_json, least_costliest, plan, stage_costs

HEAVY_ENDS = {"units": "ms", "layers": [{"F": 1, "I": 1, "W": 1, "activation": 1}] * 8,
              "first": {"F": 2, "I": 1, "W": 2}, "last": {"F": 3, "I": 3, "W": 3}}


def test_heavy_embedding_and_head_get_fewer_layers_and_a_shorter_step_than_the_even_split():
    found = plan(layer_costs_from_json(HEAVY_ENDS), 4, 8, schedules=["1f1b"])
    assert found.even_layers == (2, 2, 2, 2) and sum(found.layers) == 8
    assert found.layers[0] < 2 or found.layers[-1] < 2
    assert found.step < found.even_step and found.step >= found.lower_bound


def test_the_plan_is_the_best_of_every_schedule_it_tried():
    costs = layer_costs_from_json(HEAVY_ENDS)
    best = plan(costs, 2, 4)
    for name in ("1f1b", "gpipe", "zb-h1"):
        assert best.step <= plan(costs, 2, 4, schedules=[name]).step


def test_the_stage_costs_sum_their_layers_and_the_ends():
    data = stage_costs(layer_costs_from_json(HEAVY_ENDS), (3, 5))
    assert [s["F"] for s in data["stages"]] == [5.0, 8.0]
    assert least_costliest(layer_costs_from_json(HEAVY_ENDS), 2) == (5, 3)
    assert even(8, 3) == (3, 2, 3)


def test_a_bad_layer_cost_file_names_the_place():
    with pytest.raises(UsageError, match=r"\$.layers\[1\]: F, I and W must be given"):
        layer_costs_from_json({"layers": [{"F": 1, "I": 1, "W": 1}, {"F": 1}]})


def test_the_command_writes_a_valid_pipe_and_the_layer_map(tmp_path, capsys):
    costs = tmp_path / "layers.json"
    costs.write_text(json.dumps(HEAVY_ENDS))
    out = tmp_path / "plan.pipe"
    assert main(["plan", str(costs), "--ranks", "2", "--microbatches", "4", "--schedules", "1f1b,zb-h1",
                 "-o", str(out), "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    layer_map = json.loads((tmp_path / "plan.layers.json").read_text())
    assert printed["layers"] == layer_map["layers"] and sum(layer_map["layers"]) == 8
    assert pipeforge.verify(pipeforge.load(str(out))).valid
    assert main(["plan", str(costs), "--ranks", "2", "--microbatches", "4", "-o", str(out)]) == 2  # exists


def test_measured_layer_costs_feed_the_plan():
    from pipeforge.models.profile import layer_costs
    from tests.models import families

    tokens, mask, _ = families.batch("llama", 2, seed=0)
    measured = layer_costs(families.build("llama", layers=5), tokens, attention_mask=mask, repeats=1)
    assert len(measured["layers"]) == 5 and set(measured["first"]) == {"F", "I", "W", "parameters"}
    assert all(layer[k] > 0 for layer in measured["layers"] for k in ("F", "I", "W", "activation", "parameters"))
    assert measured["first"]["parameters"] > 0  # the embedding
    found = plan(layer_costs_from_json(measured), 2, 4, schedules=["1f1b"])
    assert sum(found.layers) == 5
