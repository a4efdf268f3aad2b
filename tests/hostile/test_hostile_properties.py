"""Properties of hostile text, in process: whatever a .pipe text holds, loading it gives a Schedule or a
PipeforgeError (never another exception, never a recursion limit), and the error's report holds no
character a terminal would act on, with the caret under the column it names."""

from __future__ import annotations

import unicodedata

from hypothesis import given, settings
from hypothesis import strategies as st

from pipeforge.errors import PipeforgeError, Source, caret_block, printable
from pipeforge.lang import load_text

HOSTILE = ["\x1b", "\x1b[2J", "\x07", "\x00", "\x0c", "\r", "\r\n", "\x0b", "\x85", "\u2028", "\u2029", "\u202e",
           "\x9b", "\u09ea", "\uff18", "\t", "\ufeff"]
PIECES = ["schedule s {", "}", "{", "(", ")", "ranks ", "stages 1 placement loop ", "microbatches ", "rank r {",
          "F(0, 0) ", "B(0, 0) ", "let a = ", "a * a ", "1 + ", "- ", "not ", "min(1, ", "require ", "# ",
          '"x"', "1e308 * 10 ", "9" * 90, " ", "\n", "_ ", "0F0 ", "costs { F = ", "x "]
texts = st.lists(st.sampled_from(PIECES + HOSTILE), max_size=60).map("".join) | \
    st.tuples(st.sampled_from(["(", "- ", "not ", "min(1, ", "1 + ("]), st.integers(90, 400)).map(
        lambda pair: "schedule s { ranks 1 let a = " + pair[0] * pair[1] + "1 }")

UNPRINTABLE = {"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"}


def assert_printable(report: str) -> None:
    bad = [char for char in report if char not in "\n\t" and unicodedata.category(char) in UNPRINTABLE]
    assert not bad, (bad, report)


@settings(max_examples=300, deadline=None)
@given(texts)
def test_any_text_loads_or_fails_plainly(text):
    try:
        load_text(text, filename="t.pipe")
    except PipeforgeError as error:
        assert_printable(error.render())


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(["a", "b", " ", "\t", *HOSTILE]), max_size=30).map("".join),
       st.integers(1, 30), st.integers(1, 5))
def test_the_caret_stands_under_its_column(line, col, width):
    """Each character before the column takes as many columns on screen as its escape: the caret lands
    under the escaped form of the character the span starts at."""
    line = line.replace("\n", "").replace("\r", "")  # one line: lark's line counting is tested elsewhere
    source = Source("t.pipe", line + "\n")
    block = caret_block(source.span(1, col, 1, col + width))
    if not line:
        return
    shown, caret = block.split("\n")
    assert_printable(shown)
    start = min(col - 1, len(line))
    expected = sum(len(printable(char) if char != "\t" else " ") for char in line[:start]) + (col - 1 - start)
    if len(line) <= 120:
        assert caret.index("^") - 4 == expected, (line, col, block)


@given(st.text(max_size=40))
def test_printable_keeps_what_is_printable_and_escapes_the_rest(text):
    out = printable(text, keep="\n")
    assert_printable(out)
    if all(char in "\n\t" or unicodedata.category(char) not in UNPRINTABLE for char in text):
        assert out == text
