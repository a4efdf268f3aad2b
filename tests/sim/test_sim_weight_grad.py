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
