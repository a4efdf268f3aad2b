"""Spans refer to the text they came from: the caret shows that text, whatever was loaded later."""

from __future__ import annotations

import pipeforge
import pipeforge.errors as errors
from pipeforge.errors import SemanticError, Source, Span, caret_block
from pipeforge.interop.torch_csv import read_csv, read_csv_text

# Two schedules whose line 5 differs; s is invalid (0B0 before 0F0), t is valid.
S = """schedule s(P = 2, M = 1) {
    ranks P
    stages P placement loop
    microbatches M
    rank 0 { B(0, 0) F(0, 0) }
    rank 1 { F(1, 0) B(1, 0) }
}
"""
T = S.replace("schedule s(", "schedule t(").replace("rank 0 { B(0, 0) F(0, 0) }", "rank 0 { F(0, 0) B(0, 0) }")
S_LINE = "rank 0 { B(0, 0) F(0, 0) }"
T_LINE = "rank 0 { F(0, 0) B(0, 0) }"


def test_an_error_of_one_string_shows_its_own_line_after_another_string_is_loaded():
    s = pipeforge.loads(S)
    t = pipeforge.loads(T)
    assert pipeforge.verify(t).valid
    rendered = pipeforge.verify(s).render()
    assert "<string>:5:14: order" in rendered
    assert S_LINE in rendered and T_LINE not in rendered


def test_an_error_raised_while_loading_shows_the_line_of_that_text():
    pipeforge.loads(T)
    try:
        pipeforge.loads(S.replace("B(0, 0) F(0, 0)", "B(0, 0) F(0, 9)"))
    except SemanticError as error:
        assert "F(0, 9)" in error.render()
    else:
        raise AssertionError("microbatch 9 of 1 was accepted")


def test_a_file_edited_after_loading_still_shows_the_text_that_was_loaded(tmp_path):
    path = tmp_path / "s.pipe"
    path.write_text(S, encoding="utf-8")
    s = pipeforge.load(str(path))
    path.write_text(T, encoding="utf-8")
    rendered = pipeforge.verify(s).render()
    assert f"{path}:5:14: order" in rendered
    assert S_LINE in rendered and T_LINE not in rendered


def test_a_deleted_csv_still_shows_its_cells(tmp_path):
    path = tmp_path / "s.csv"
    path.write_text("0B0,0F0\n1F0,1B0\n", encoding="utf-8")
    s = read_csv(path)
    path.unlink()
    rendered = pipeforge.verify(s).render()
    assert "0B0,0F0" in rendered
    read_csv_text("0F0,0B0\n1F0,1B0\n")  # another CSV text of the default name changes nothing
    assert "0B0,0F0" in pipeforge.verify(s).render()


def test_spans_compare_by_place_alone():
    source = Source("a.pipe", "one\ntwo\n")
    assert source.span(2, 1, 2, 4) == Span("a.pipe", 2, 1, 2, 4)
    assert Source("a.pipe", "other\ntext\n").span(2, 1) == source.span(2, 1)
    assert hash(source.span(2, 1)) == hash(Span("a.pipe", 2, 1))
    assert "two" not in repr(source.span(2, 1))


def test_the_caret_comes_from_the_span_and_no_file_is_read(tmp_path):
    path = tmp_path / "x.pipe"
    path.write_text("line one\n", encoding="utf-8")
    assert caret_block(Span(str(path), 1, 1)) == ""  # a span without its text shows no caret
    assert caret_block(Source(str(path), "other text\n").span(1, 7, 1, 11)) == "    other text\n          ^^^^"
    assert not hasattr(errors, "_SOURCES") and not hasattr(errors, "remember_source")
