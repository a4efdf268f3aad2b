"""Expressions: precedence, integer arithmetic, conditions, and their errors."""

import pytest

from pipeforge.errors import PipeSyntaxError, SemanticError
from pipeforge.lang import load_text


def value_of(expression: str, **names: int) -> object:
    """Elaborate ``expression`` as the microbatch count of a one-rank schedule."""
    lets = " ".join(f"let {name} = {value}" for name, value in names.items())
    schedule = load_text(f"schedule s() {{ {lets} ranks 1 stages 1 placement loop microbatches {expression} }}")
    return schedule.microbatches


@pytest.mark.parametrize("expression, expected", [
    ("1 + 2 * 3", 7), ("(1 + 2) * 3", 9), ("7 // 2", 3), ("-7 // 2 + 10", 6), ("7 % 3", 1), ("-1 % 4", 3),
    ("10 - 2 - 3", 5), ("--3", 3), ("min(4, 2, 9)", 2), ("max(1, 2 * 3)", 6), ("P * 2 - 1", 7),
    ("max(1, M // P)", 2), ("min(M, P - 1 - 0)", 3),
])
def test_integer_arithmetic(expression, expected):
    assert value_of(expression, P=4, M=8) == expected


@pytest.mark.parametrize("condition, expected", [
    ("1 < 2", True), ("2 <= 1", False), ("1 == 1 and 2 != 2", False), ("1 == 1 or 2 != 2", True),
    ("not 1 > 2", True), ("not (1 > 2 or 3 > 2)", False), ("1 + 1 == 2 and not 0 > 1", True),
    ("1 > 2 or 2 > 1 and 3 > 4", False),
])
def test_conditions(condition, expected):
    text = f"schedule s() {{ ranks 1 stages 1 placement loop microbatches 1 if {condition} {{ rank 0 {{ F(0, 0) }} }} }}"
    assert bool(load_text(text).programs[0]) is expected


@pytest.mark.parametrize("expression, message", [
    ("3 // 0", "division by zero"), ("3 % (2 - 2)", "division by zero"), ("1.5 * 2", "must be an integer"),
    ("1 < 2", "must be an integer, got a condition"), ("nope", "undefined name 'nope'"),
    ("-(1 < 2)", "cannot negate"),
])
def test_expression_errors(expression, message):
    with pytest.raises(SemanticError, match=message):
        value_of(expression)


def test_comparisons_do_not_chain():
    with pytest.raises(PipeSyntaxError):
        value_of("1 < 2 < 3")


def test_floats_in_costs():
    schedule = load_text("schedule s(P = 4) { ranks 1 stages 1 placement loop microbatches 1 "
                         "costs { F = 1.5 * 2  I = P // 2  W = 1e-1  comm = 2.5e1 } }")
    assert (schedule.costs.F, schedule.costs.I, schedule.costs.W, schedule.costs.comm) == (3.0, 2.0, 0.1, 25.0)
