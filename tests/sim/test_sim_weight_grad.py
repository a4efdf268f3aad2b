"""A stage that holds more from I to W than its F left (``weight_grad`` above ``activation``, as the zoo's GPT
stages do: the gradients a split backward's I leaves for W): its I adds the excess, one rule
(``semantics.memory_effect``) that the cost file, simulate, verify and optimize read alike."""

from __future__ import annotations

import json

import pytest

from pipeforge import optimize, verify
from pipeforge.ir import ActionKind, MemorySpec
from pipeforge.library import load_library_schedule as library_schedule
from pipeforge.semantics import stage_effect
from pipeforge.sim import simulate
from pipeforge.sim.costfile import with_cost_file

STAGES = [{"F": 1, "I": 1, "W": 1, "activation": 100, "weight_grad": 140},
          {"F": 1, "I": 1, "W": 1, "activation": 100, "weight_grad": 140}]


def _with_limit(schedule, limit):
    from dataclasses import replace

    return replace(schedule, memory=replace(schedule.memory, limit=limit))


def test_an_i_holding_more_than_its_activation_adds_the_excess():
    memory = MemorySpec(activation=(1.0,), weight_grad=(1.4,))
    assert stage_effect(memory, ActionKind.I, 0) == pytest.approx((0.4, 0.0))
    assert stage_effect(memory, ActionKind.W, 0) == pytest.approx((0.0, 1.4))
    assert stage_effect(MemorySpec(activation=(1.0,), weight_grad=(0.3,)), ActionKind.I, 0) == pytest.approx((0.0, 0.7))


def test_simulate_verify_and_optimize_count_the_excess(tmp_path):
    path = tmp_path / "costs.json"
    path.write_text(json.dumps({"units": "ms", "stages": STAGES}), encoding="utf-8")
    schedule = with_cost_file(library_schedule("zb-h1", {"P": 2, "M": 4}), path)
    peaks = simulate(schedule).peak_memory
    # rank 1 (the last stage): F0 1, I0 1.4, F1 2.4, I1 2.8 before W0 releases 1.4
    assert peaks[1] == pytest.approx(2.8)
    capped = with_cost_file(library_schedule("zb-h1", {"P": 2, "M": 4}), _capped(tmp_path, path))
    assert simulate(capped).peak_memory[1] == pytest.approx(2.0)  # what the cap predicted
    top = max(peaks)
    assert verify(_with_limit(schedule, top)).valid
    below = verify(_with_limit(schedule, top - 0.05))
    assert not below.valid and {v.kind for v in below.violations} == {"memory"}
    for limit in (2.5, 2.0):  # at 2.0 the greedy's warm-up leaves room for the I after its forwards (it had not)
        result = optimize(_with_limit(schedule, limit), strategy="auto", time_limit=3)
        assert max(simulate(result.schedule).peak_memory) <= limit + 1e-9
        assert verify(result.schedule).valid


def _capped(tmp_path, path):
    data = json.loads(path.read_text())
    for stage in data["stages"]:
        stage["weight_grad"] = min(stage["weight_grad"], stage["activation"])
    out = tmp_path / "capped.json"
    out.write_text(json.dumps(data), encoding="utf-8")
    return out


# --- one rule for the weight-gradient share, whatever the entry (semantics.weight_grad_problem) ---------------

ZB = """schedule zb(P = 2, M = 4) {
    ranks P
    stages P placement loop
    microbatches M
    memory { MEMORY }
    rank r {
        for m in 0 .. P - r { F(r, m) }
        for m in 0 .. M - (P - r) { I(r, m)  F(r, m + P - r) W(r, m) }
        for m in M - (P - r) .. M { I(r, m) W(r, m) }
    }
}
"""


def _cli(capsys, *argv):
    from pipeforge.cli import main

    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def _entry(kind, tmp_path, value):
    """``argv`` for ``pipeforge simulate --json`` with a weight gradient of ``value`` given at ``kind``."""
    pipe = tmp_path / "zb.pipe"
    memory = {"pipe weights": f"weights = {value}", "pipe weight_grad": f"weight_grad[0] = {value} "
              f"weight_grad[1] = {value}"}.get(kind, "limit = 100")
    pipe.write_text(ZB.replace("MEMORY", memory), encoding="utf-8")
    if kind == "cost flag":
        return ["simulate", str(pipe), "--cost", f"F=1,weights={value}", "--json"]
    if kind == "cost file":
        stages = [{"F": 1, "I": 1, "W": 1, "activation": 100, "weight_grad": 100 * float(value)}] * 2
        (tmp_path / "costs.json").write_text(json.dumps({"stages": stages}), encoding="utf-8")
        return ["simulate", str(pipe), "--costs", str(tmp_path / "costs.json"), "--json"]
    return ["simulate", str(pipe), "--json"]


ENTRIES = ("cost flag", "pipe weights", "pipe weight_grad", "cost file")


@pytest.mark.parametrize("kind", ENTRIES)
def test_a_weight_gradient_above_the_activation_is_accepted_by_every_entry_alike(kind, tmp_path, capsys):
    code, out, err = _cli(capsys, *_entry(kind, tmp_path, "1.4"))
    assert code == 0, err
    assert json.loads(out)["peak_memory"] == pytest.approx([3.4, 2.4])  # rank 0: F0 F1 I0 (+0.4) F2


PLACES = {"cost flag": "--cost item 'weights=-1'", "pipe weights": "zb.pipe:5:24:",
          "pipe weight_grad": "zb.pipe:5:31:", "cost file": "costs.json: $.stages[0].weight_grad:"}


@pytest.mark.parametrize("kind", ENTRIES)
def test_a_negative_weight_gradient_is_refused_by_every_entry_alike(kind, tmp_path, capsys):
    from pipeforge.semantics import WEIGHT_GRAD_RULE

    code, out, err = _cli(capsys, *_entry(kind, tmp_path, "-1"))
    assert code == 2 and out == ""
    assert PLACES[kind] in err and "expected a finite number >= 0" in err and WEIGHT_GRAD_RULE in err
    if kind.startswith("pipe"):
        assert "^" in err  # the line shown with a caret under the value


def test_the_layer_file_of_plan_asks_the_same_rule():
    from pipeforge.errors import UsageError
    from pipeforge.plan import layer_costs_from_json
    from pipeforge.semantics import WEIGHT_GRAD_RULE

    layer = {"F": 1, "I": 1, "W": 1, "activation": 10}
    assert layer_costs_from_json({"layers": [{**layer, "weight_grad": 14}]}).layers[0]["weight_grad"] == 14
    with pytest.raises(UsageError, match=r"\$\.layers\[0\]\.weight_grad: expected a finite number >= 0") as caught:
        layer_costs_from_json({"layers": [{**layer, "weight_grad": -1}]})
    assert WEIGHT_GRAD_RULE in str(caught.value)


def test_the_bounds_read_uniform_and_per_stage_shares_above_one_alike():
    uniform, per_stage = MemorySpec(weights=1.4), MemorySpec(activation=(1.0, 1.0), weight_grad=(1.4, 1.4))
    assert uniform.least_weights(2) == per_stage.least_weights(2) == 1.0


@pytest.mark.parametrize("strategy", ["auto", "greedy", "local", "exact"])
def test_every_strategy_finds_an_order_within_a_limit_the_input_exceeds(tmp_path, strategy):
    """The input (peak 2.8) is over 2.5: local search starts from the greedy orders then (it started from the
    input, which no move that shortens the span brings under the limit, and found nothing)."""
    path = tmp_path / "costs.json"
    path.write_text(json.dumps({"units": "ms", "stages": STAGES}), encoding="utf-8")
    schedule = _with_limit(with_cost_file(library_schedule("zb-h1", {"P": 2, "M": 4}), path), 2.5)
    result = optimize(schedule, strategy=strategy, time_limit=3)
    assert result.improved and result.found_by != "input"
    assert max(simulate(result.schedule).peak_memory) <= 2.5 + 1e-9 and verify(result.schedule).valid
