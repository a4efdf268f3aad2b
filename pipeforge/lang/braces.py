"""Which '{' a writer most likely forgot to close, judged by indentation.

The parser only learns at the end of the file that a brace is missing, and by
then every '}' has been matched with the wrong opener, so the brace it reports
open is the outermost one. Indentation tells more: a block opened on a line
indented I should end with a '}' line indented I; when a line indented I or less
comes first (not that '}'), the block was left open there.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Brace:
    """An opening brace: its line and column (1-based), and the line that gives it away."""

    line: int
    col: int
    evidence_line: int | None


def _braces(text: str) -> list[tuple[str, int]]:
    """Every '{' and '}' outside comments and strings, with its offset."""
    found: list[tuple[str, int]] = []
    index, length = 0, len(text)
    while index < length:
        char = text[index]
        if char == "#":
            index = text.find("\n", index)
            index = length if index < 0 else index
            continue
        if char == '"':
            stops = [stop for stop in (text.find('"', index + 1), text.find("\n", index + 1)) if stop >= 0]
            index = min(stops) if stops else length
        elif char in "{}":
            found.append((char, index))
        index += 1
    return found


def _matches(braces: list[tuple[str, int]]) -> dict[int, int | None]:
    """Opener offset -> the offset of the '}' that closes it by counting (None: never closed)."""
    open_offsets: list[int] = []
    closing: dict[int, int | None] = {}
    for char, offset in braces:
        if char == "{":
            open_offsets.append(offset)
            closing[offset] = None
        elif open_offsets:
            closing[open_offsets.pop()] = offset
    return closing


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" \t"))


def likely_unclosed(text: str) -> Brace | None:
    """The last-opened brace whose block the indentation says was left open; None when none is clear."""
    lines = text.split("\n")
    starts = [0]
    for text_line in lines[:-1]:
        starts.append(starts[-1] + len(text_line) + 1)
    line_of = _line_finder(starts)
    suspects = []
    for opener, closer in _matches(_braces(text)).items():
        line = line_of(opener)
        if closer is not None and line_of(closer) == line:
            continue
        evidence = _first_shallow_line(lines, line, closer, line_of)
        if evidence is not None or closer is None:
            suspects.append(Brace(line + 1, opener - starts[line] + 1, None if evidence is None else evidence + 1))
    with_evidence = [brace for brace in suspects if brace.evidence_line is not None]
    return max(with_evidence or suspects, key=lambda b: (b.line, b.col), default=None)


def _first_shallow_line(lines: list[str], line: int, closer: int | None,
                        line_of: Callable[[int], int]) -> int | None:
    """The first line after ``line`` indented no deeper than it, unless it is the block's own '}' line.

    The block's '}' must sit at the opener's indentation: a '}' further left that
    closes it by counting belongs, by its indentation, to an outer block.
    """
    depth = _indent(lines[line])
    for index in range(line + 1, len(lines)):
        stripped = lines[index].strip()
        if not stripped or stripped.startswith("#") or _indent(lines[index]) > depth:
            continue
        own_close = closer is not None and line_of(closer) == index and _indent(lines[index]) == depth
        return None if own_close and stripped.startswith("}") else index
    return None


def _line_finder(starts: list[int]) -> Callable[[int], int]:
    from bisect import bisect_right

    return lambda offset: bisect_right(starts, offset) - 1
