"""Per-stage costs: the JSON cost file (``--costs FILE``) and the ``.pipe`` per-stage entries."""

from __future__ import annotations

import json

import pytest

from pipeforge.cli import main
from pipeforge.ir import ActionKind, MemorySpec
from pipeforge import loads as parse_text
from pipeforge.lang.printer import print_schedule
from pipeforge.library import load_library_schedule as library_schedule
from pipeforge.sim import simulate
from pipeforge.sim.costfile import CostFileError, cost_file_from_json, with_cost_file

HEAVY_ENDS = {"units": "ms", "links": [0.5, 0.0, 0.0],
              "stages": [{"F": 3, "I": 3, "W": 2, "activation": 100},
                         {"F": 1, "I": 1, "W": 1, "activation": 50},
                         {"F": 1, "I": 1, "W": 1, "activation": 50},
                         {"F": 3, "I": 3, "W": 2, "activation": 80}]}


def _write(tmp_path, data) -> str:
    path = tmp_path / "costs.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    return str(path)


def test_file_gives_durations_links_and_memory_per_stage():
    found = cost_file_from_json(HEAVY_ENDS)
    costs = found.costs
    assert [costs.duration(ActionKind.F, s) for s in range(4)] == [3, 1, 1, 3]
    assert [costs.duration(ActionKind.B, s) for s in range(4)] == [5, 2, 2, 5]
    assert costs.latency(0, 1) == costs.latency(1, 0) == 0.5 and costs.latency(2, 3) == 0.0
    assert found.activation == (1.0, 0.5, 0.5, 0.8) and found.activation_bytes == 100
    assert found.weight_grad == ()


@pytest.mark.parametrize(("change", "where"), [
    (lambda d: d["stages"][2].__setitem__("F", -1), "$.stages[2].F"),
    (lambda d: d["stages"][1].pop("I"), "$.stages[1]"),
    (lambda d: d["stages"][3].__setitem__("X", 1), "$.stages[3].X"),
    (lambda d: d["stages"][0].pop("activation"), "$.stages[0]"),
    (lambda d: d.__setitem__("links", [0, 0, 0, 0]), "$.links"),
    (lambda d: d["links"].__setitem__(1, "fast"), "$.links[1]"),
    (lambda d: d.__setitem__("stages", []), "$.stages"),
    (lambda d: d["stages"][0].__setitem__("weight_grad", -1), "$.stages[0].weight_grad"),
    (lambda d: d.__setitem__("step", -1), "$.step"),
    (lambda d: d.__setitem__("dispatch", "slow"), "$.dispatch"),
    (lambda d: d.__setitem__("chain_sum", [1, 2, 3, 4, 5]), "$.chain_sum"),
    (lambda d: d.__setitem__("chain_sum", [1, None]), "$.chain_sum[1]"),
])
def test_bad_values_are_named_by_json_path(change, where):
    data = json.loads(json.dumps(HEAVY_ENDS))
    change(data)
    with pytest.raises(CostFileError) as caught:
        cost_file_from_json(data, "c.json")
    assert caught.value.where == where and str(caught.value).startswith(f"c.json: {where}: ")


def test_cli_bad_file_exits_2_naming_file_and_path(tmp_path, capsys):
    data = json.loads(json.dumps(HEAVY_ENDS))
    data["stages"][2]["W"] = 0
    path = _write(tmp_path, data)
    assert main(["simulate", "1f1b", "--costs", path]) == 2
    assert f"{path}: $.stages[2].W: expected a number > 0" in capsys.readouterr().err
    (tmp_path / "broken.json").write_text("{\"stages\": [", encoding="utf-8")
    assert main(["simulate", "1f1b", "--costs", str(tmp_path / "broken.json")]) == 2
    assert "not JSON" in capsys.readouterr().err


def test_stage_count_must_match_the_schedule(tmp_path, capsys):
    assert main(["simulate", "1f1b", "-D", "P=2", "--costs", _write(tmp_path, HEAVY_ENDS)]) == 2
    assert "4 stages, but the schedule" in capsys.readouterr().err


def test_simulate_uses_per_stage_durations(tmp_path, capsys):
    assert main(["simulate", "1f1b", "--json", "--costs", _write(tmp_path, HEAVY_ENDS)]) == 0
    heavy = json.loads(capsys.readouterr().out)
    assert main(["simulate", "1f1b", "--json"]) == 0
    uniform = json.loads(capsys.readouterr().out)
    assert heavy["makespan"] > uniform["makespan"]
    assert [r["busy"] for r in heavy["ranks"]] == [8 * 8.0, 8 * 3.0, 8 * 3.0, 8 * 8.0]


def test_dispatch_is_added_to_every_compute_action():
    costs = cost_file_from_json({**HEAVY_ENDS, "dispatch": 0.25}).costs
    assert [costs.duration(ActionKind.F, s) for s in range(4)] == [3.25, 1.25, 1.25, 3.25]
    assert [costs.duration(ActionKind.W, s) for s in range(4)] == [2.25, 1.25, 1.25, 2.25]
    assert costs.duration(ActionKind.B, 0) == 5.5  # I + W (3 + 2) with the dispatch of each: two actions


def test_step_overhead_is_added_to_the_step_time_not_the_makespan(tmp_path, capsys):
    data = {**HEAVY_ENDS, "step": 1.5, "chain_sum": [10.0, 20.0, 30.0, 40.0]}
    found = cost_file_from_json(data)
    assert found.costs.overhead.step == 1.5 and found.costs.overhead.chain_sum == (10.0, 20.0, 30.0, 40.0)
    plain = simulate(with_cost_file(library_schedule("1f1b"), _write(tmp_path, HEAVY_ENDS)))
    loop = simulate(with_cost_file(library_schedule("1f1b"), _write(tmp_path, data)))
    assert loop.makespan == plain.makespan and loop.step_time == plain.makespan + 1.5  # one chain: no sum
    # Chimera, 4 ranks: rank r holds stage r (chain 0) and stage 3 - r (chain 1), the other replicas elsewhere
    chimera = simulate(with_cost_file(library_schedule("chimera", {"P": 4}), _write(tmp_path, data)))
    assert chimera.step_time == pytest.approx(chimera.makespan + 1.5 + 50.0)
    assert main(["simulate", "chimera", "-D", "P=4", "--costs", _write(tmp_path, data), "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["step_time"] == pytest.approx(shown["makespan"] + 51.5)
    assert shown["costs"]["step"] == 1.5 and shown["costs"]["chain_sum"] == [10.0, 20.0, 30.0, 40.0]
    assert main(["simulate", "chimera", "-D", "P=4", "--costs", _write(tmp_path, data)]) == 0
    assert "step time" in capsys.readouterr().out
    assert main(["simulate", "chimera", "-D", "P=4", "--costs", _write(tmp_path, HEAVY_ENDS)]) == 0
    assert "step time" not in capsys.readouterr().out


def test_with_cost_file_sets_memory_per_stage(tmp_path):
    schedule = with_cost_file(library_schedule("1f1b"), _write(tmp_path, HEAVY_ENDS))
    assert schedule.memory.activation == (1.0, 0.5, 0.5, 0.8)
    assert schedule.memory.stage_weight_grad(1) == 0.25


PIPE = """schedule s(P = 2, M = 2) {
    ranks P
    stages P placement loop
    microbatches M
    costs { F = 1 I = 1 W = 1 comm = 0.25 comm[0] = 0.5 F[1] = 2 }
    memory { limit = 4 activation[1] = 0.5 weight_grad[1] = 0.1 }
    rank r { for m in 0 .. M { F(r, m) } for m in 0 .. M { B(r, m) } }
}
"""


def test_pipe_per_stage_entries_round_trip():
    schedule = parse_text(PIPE)
    assert schedule.costs.links == (0.5,) and schedule.costs.latency(1, 0) == 0.5
    assert schedule.memory.activation == (1.0, 0.5) and schedule.memory.weight_grad == (0.5, 0.1)
    again = parse_text(print_schedule(schedule))
    assert again.costs == schedule.costs and again.memory == schedule.memory


@pytest.mark.parametrize(("entry", "message"), [
    ("costs { comm[1] = 0.5 }", "link 1 is out of range"),
    ("memory { limit[0] = 2 }", "'limit' has no per-stage form"),
    ("memory { activation[2] = 1 }", "stage 2 is out of range"),
    ("memory { activation[0] = -1 }", "finite and at least 0"),
])
def test_pipe_per_stage_errors(entry, message):
    text = PIPE.replace("    costs {", f"    {entry}\n    costs {{", 1) if entry.startswith("memory") else \
        PIPE.replace("costs { F = 1 I = 1 W = 1 comm = 0.25 comm[0] = 0.5 F[1] = 2 }", entry)
    if entry.startswith("memory"):
        text = text.replace("    memory { limit = 4 activation[1] = 0.5 weight_grad[1] = 0.1 }\n", "")
    from pipeforge.errors import SemanticError
    with pytest.raises(SemanticError, match=message.replace("[", r"\[").replace("]", r"\]")):
        parse_text(text)


def test_memory_spec_defaults_per_stage():
    spec = MemorySpec(weights=0.3)
    assert spec.stage_activation(5) == 1.0 and spec.stage_weight_grad(5) == 0.3 and spec.uniform
