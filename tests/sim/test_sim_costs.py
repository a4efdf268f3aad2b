"""``--cost`` text: field-by-field overrides, and every malformed form refused as an ArgumentError."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipeforge.commands import wording
from pipeforge.errors import ArgumentError
from pipeforge.ir import COST_RANGE, ActionKind, CostModel, MemorySpec
from pipeforge.sim.costs import costs_for, costs_to_json, memory_for, parse_cost_flag
from tests.sim.sim_orders import one_f_one_b


@pytest.mark.parametrize("text, expected", [
    ("F=2", CostModel(F=2)),
    ("F=1,I=1,W=1,comm=0", CostModel()),
    ("F=1.5, I=2 ,W=0.5", CostModel(F=1.5, I=2, W=0.5)),
    ("B=3", CostModel(B=3)),
    ("comm=0.601", CostModel(comm=0.601)),
])
def test_good_cost_flags(text, expected):
    assert parse_cost_flag(text) == expected


@pytest.mark.parametrize("text, message", [
    ("", "expected NAME=VALUE"),
    ("F", "expected NAME=VALUE"),
    ("=2", "expected NAME=VALUE"),
    ("X=1", "unknown cost 'X'"),
    ("F=fast", "'fast' is not a number"),
    ("F=-1", ">= 0"),
    ("F=0", "must be > 0"),
    ("comm=nan", "finite"),
    ("W=inf", "finite"),
    ("F=1,,I=2", "expected NAME=VALUE"),
    ("F=1,F=4", "F is given twice, first as 'F=1'"),
])
def test_bad_cost_flags(text, message):
    with pytest.raises(ArgumentError, match=message) as caught:
        parse_cost_flag(text)
    assert caught.value.argument.keyword == "costs"
    assert message in caught.value.problem and "--" not in str(caught.value)
    assert wording.message(caught.value).startswith("--cost")


def test_flag_overrides_the_schedules_costs_field_by_field():
    from dataclasses import replace

    schedule = replace(one_f_one_b(2, 2), costs=CostModel(F=3, I=2, W=1, comm=0.5))
    assert costs_for(schedule, "W=4") == CostModel(F=3, I=2, W=4, comm=0.5)
    assert costs_for(schedule, None) == CostModel(F=3, I=2, W=1, comm=0.5)
    assert costs_for(one_f_one_b(2, 2), None) == CostModel()


def test_b_defaults_to_i_plus_w_in_json():
    assert costs_to_json(CostModel(I=2, W=0.5))["B"] == 2.5
    assert costs_to_json(CostModel(B=7))["B"] == 7


def test_memory_limit_flag():
    assert memory_for(one_f_one_b(2, 2), 3.0) == MemorySpec(limit=3.0)
    assert memory_for(one_f_one_b(2, 2), None) == MemorySpec()
    for bad in (0.0, -1.0, float("inf"), float("nan")):
        with pytest.raises(ArgumentError, match=r"^memory_limit=") as caught:
            memory_for(one_f_one_b(2, 2), bad)
        assert caught.value.argument.keyword == "memory_limit" and caught.value.value is bad
        assert wording.message(caught.value).startswith(f"--memory-limit {bad!r}: expected a positive number")


values = st.floats(min_value=0.001, max_value=1e6, allow_nan=False)


@given(values, values, values, st.just(0.0) | st.floats(min_value=COST_RANGE[0], max_value=100))  # ir.cost_problem
def test_printed_costs_parse_back(f, i, w, comm):
    model = CostModel(F=f, I=i, W=w, comm=comm)
    text = ",".join(f"{name}={getattr(model, name)!r}" for name in ("F", "I", "W", "comm"))
    assert parse_cost_flag(text) == model
    assert parse_cost_flag(text).duration(ActionKind.B, 0) == pytest.approx(i + w)


@pytest.mark.parametrize("item", ["F=1e-320", "F=1e300", "comm=5e-324", "I=1e13"])
def test_a_cost_past_the_range_is_refused_naming_it(item):
    with pytest.raises(ArgumentError, match="a nonzero cost must be between") as caught:
        parse_cost_flag(item)
    assert caught.value.argument.item == item
