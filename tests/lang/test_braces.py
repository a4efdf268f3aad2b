"""The '{' a writer forgot to close, found by indentation."""

import pytest

from pipeforge.lang.braces import Brace, likely_unclosed

NESTED = """schedule s(P = 4, M = 8) {
    rank r {
        for m in 0 .. M { F(r, m)
        for m in 0 .. M { B(r, m) }
    }
}
"""
RANK_LEFT_OPEN = """schedule s() {
    rank r {
        F(r, 0)
}
"""
LAST_LINE = """schedule s() {
    rank 0 { F(0, 0) }
"""
IN_COMMENT_AND_STRING = """schedule s() {  # a { in a comment
    require 1 > 0, "a { in a string"
    rank 0 {
        F(0, 0)
}
"""
BALANCED = """schedule s() {
    rank 0 { F(0, 0) }
}
"""


@pytest.mark.parametrize("text, expected", [
    (NESTED, Brace(3, 25, 4)),
    (RANK_LEFT_OPEN, Brace(2, 12, 4)),
    (LAST_LINE, Brace(1, 14, None)),
    (IN_COMMENT_AND_STRING, Brace(3, 12, 5)),
    (BALANCED, None),
])
def test_likely_unclosed(text, expected):
    assert likely_unclosed(text) == expected
