"""Whatever the text, the language answers with a schedule or a located PipeforgeError, nothing else.

Arbitrary text, and random mutations (delete, insert, swap characters or tokens)
of valid programs: parsing and elaborating every schedule either succeeds or
raises PipeSyntaxError / SemanticError / UsageError whose render() names
file:line:col.
"""

import re
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeforge.errors import PipeforgeError, PipeSyntaxError, SemanticError, UsageError
from pipeforge.lang import compile_text, context
from pipeforge.lang.elaborate import elaborate
from pipeforge.resources import library_dir

SOURCES = [p.read_text() for p in sorted(library_dir().glob("*.pipe"))] + [
    p.read_text() for p in sorted((Path(__file__).parent / "programs").glob("*.pipe"))]
TOKEN = re.compile(r"\w+|\.\.|//|[=!<>]=|\S")
LOCATED = re.compile(r"^fuzz\.pipe:\d+:\d+: error: ", re.MULTILINE)
PIECES = ["{", "}", "(", ")", "[", "]", ",", "..", "=", "==", "0", "1", "-1", "M", "P", "r", "F", "B(", "W",
          "rank", "for", "in", "let", "if", "else", "elif", "overlap", "group", "0F0", "(0F0;1B0)", "_", "@",
          "\"", "#", "\n", "stages", "placement", "loop", "v", "reverse", "costs", "memory", "chain", "by",
          "min(", "//", "%", "not", "and", "1.5", "999999", "idle", "require", "schedule"]


@pytest.fixture(autouse=True)
def small_budget(monkeypatch):
    """Keep a mutated loop bound from running for minutes: the budget error is what we want to see."""
    monkeypatch.setattr(context, "LOOP_FUEL", 200_000)


def check_answer(text: str) -> None:
    try:
        schedules = compile_text(text, "fuzz.pipe")
        for schedule in schedules:
            elaborate(schedule)
    except (PipeSyntaxError, SemanticError, UsageError) as error:
        assert LOCATED.match(error.render()), error.render()
    except PipeforgeError as error:  # pragma: no cover - a wrong subclass is a failure
        pytest.fail(f"unexpected {type(error).__name__}: {error.render()}")


@st.composite
def mutated_sources(draw) -> str:
    text = draw(st.sampled_from(SOURCES))
    for _ in range(draw(st.integers(1, 4))):
        text = draw(st.sampled_from([_char_edit, _token_edit]))(draw, text)
    return text


def _char_edit(draw, text: str) -> str:
    at = draw(st.integers(0, len(text)))
    operation = draw(st.sampled_from(["delete", "insert", "swap"]))
    if operation == "delete":
        return text[:at] + text[at + 1:]
    if operation == "insert":
        return text[:at] + draw(st.sampled_from(PIECES + list("{}()[],;:=+-*/%<>\"'@#$"))) + text[at:]
    return text[:at] + text[at + 1:at + 2] + text[at:at + 1] + text[at + 2:]


def _token_edit(draw, text: str) -> str:
    spans = [m.span() for m in TOKEN.finditer(text)]
    start, end = spans[draw(st.integers(0, len(spans) - 1))]
    operation = draw(st.sampled_from(["delete", "replace", "duplicate"]))
    if operation == "delete":
        return text[:start] + text[end:]
    if operation == "replace":
        return text[:start] + draw(st.sampled_from(PIECES)) + text[end:]
    return text[:end] + " " + text[start:end] + text[end:]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated_sources())
def test_mutated_programs_parse_or_fail_with_a_location(text):
    check_answer(text)


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=200))
def test_arbitrary_text_parses_or_fails_with_a_location(text):
    check_answer(text)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(PIECES), max_size=30).map(" ".join))
def test_token_soup_parses_or_fails_with_a_location(text):
    check_answer("schedule s(P = 2, M = 2) { ranks P stages P placement loop microbatches M " + text)
    check_answer("schedule s(P = 2, M = 2) { ranks P stages P placement loop microbatches M rank r { "
                 + text + " } }")


@pytest.mark.parametrize("text", [
    "schedule s() { for m in 0 .. 99999999999999999999999 { } }",
    "schedule s() { let x = 99999999999999999999999 * 1.5 * 1e308 }",
    "schedule s() { costs { F = 10 ** 2 } }",
    "schedule s() { ranks 2 stages 2 placement loop microbatches 1 costs { F = 1e999 * 0 } }",
    "schedule s(P = 3) { ranks P stages P placement loop microbatches 1 rank r { rank 0 { } } }",
    "schedule s() { let x = " + "(" * 200 + "1" + ")" * 200 + " }",
    "schedule s() {\r\n ranks \x00 }",
    "schedule s() { ranks 1 stages 1 placement loop microbatches 1 rank 0 { overlap { 0SEND_F0 } } }",
    "schedule s() { ranks 1 stages 1 placement loop microbatches 1 rank 0 { (0F0;0SEND_F0) } }",
    "schedule s() { ranks 1 stages 1 placement loop microbatches 1 rank 0 { group { } } }",
])
def test_edge_cases_fail_with_a_location(text):
    check_answer(text)
