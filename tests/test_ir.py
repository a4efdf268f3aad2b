"""The IR's text forms: every action and step prints as a token that parses back to it."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipeforge.ir import (
    IDLE, Action, ActionKind, CostModel, Placement, Step, format_grid, parse_action, parse_step,
)

actions = st.builds(
    lambda stage, kind, mb, chain: Action(stage, kind, None if not kind.has_microbatch else mb, chain),
    st.integers(0, 99), st.sampled_from(list(ActionKind)), st.integers(0, 999), st.integers(0, 1),
)


@given(actions)
def test_action_token_round_trips(action):
    assert parse_action(str(action)) == action


@given(st.lists(actions.filter(lambda a: a.is_compute), min_size=1, max_size=3))
def test_overlap_step_round_trips(parts):
    step = Step(tuple(parts), overlap=True)
    assert parse_step(str(step)) == step


@given(st.lists(actions.filter(lambda a: a.is_comm), min_size=1, max_size=4))
def test_group_step_round_trips(parts):
    step = Step(tuple(parts))
    assert parse_step(str(step)) == step


@pytest.mark.parametrize("text", ["0BW3", "0F", "F0", "0X1", "2REDUCE_GRAD1", "0F1@", "-1F0", "0F1 2"])
def test_malformed_tokens_are_refused(text):
    with pytest.raises(ValueError):
        parse_action(text)


def test_step_shapes():
    assert parse_step("_") == IDLE and IDLE.is_idle
    assert str(parse_step("(0F7;7B3)")) == "(0F7;7B3)"
    group = parse_step("[0SEND_F1 0RECV_B0]")
    assert group.is_group and len(group.actions) == 2
    with pytest.raises(ValueError, match="mixes"):
        Step((parse_action("0F0"), parse_action("0SEND_F0")))


def test_placements():
    assert Placement.loop(8, 4).stage_to_rank == (0, 1, 2, 3, 0, 1, 2, 3)
    assert Placement.v(8, 4).stage_to_rank == (0, 1, 2, 3, 3, 2, 1, 0)
    assert Placement.v(8, 4).style(4) == "v"
    assert Placement((0, 2, 1)).style(3) == "explicit"


def test_costs_default_b_to_i_plus_w():
    costs = CostModel(F=1.0, I=2.0, W=0.5, per_stage=((3, "F", 4.0),))
    assert costs.duration(ActionKind.B, 0) == 2.5
    assert costs.duration(ActionKind.F, 3) == 4.0 and costs.duration(ActionKind.F, 2) == 1.0


def test_spans_are_not_part_of_equality():
    from pipeforge.errors import Span

    assert Step((parse_action("0F0"),), span=Span("a.pipe", 1, 1)) == Step((parse_action("0F0"),))


def test_grid_marks_steps():
    from pipeforge.ir import Schedule, programs_from_tokens

    sched = Schedule("g", 2, 2, 1, (Placement.loop(2, 2),), programs_from_tokens([["0F0", "0B0"], ["1F0", "1B0"]]))
    grid = format_grid(sched, {(1, 0): " <"})
    assert "Rank 0" in grid and "1F0 <" in grid
