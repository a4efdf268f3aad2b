"""The one error hierarchy of pipeforge, and source spans rendered with a caret.

Every error a user can cause is a ``PipeforgeError``. Its ``str()`` is the
message alone; ``render()`` gives the full report::

    schedules/1f1b.pipe:7:13: error: expected '}' to close the rank block
        for m in 0 .. warmup { F(r, m)
                ^^^^^^^^^^^^^^^^^^^^^^
    note: the block opened at schedules/1f1b.pipe:6:5

The command line prints ``render()`` and exits 2 (bad input) or 1 (an invalid
schedule, for ``VerificationError``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Span:
    """A region of a source file: 1-based line and column, end exclusive."""

    file: str
    line: int
    col: int
    end_line: int | None = None
    end_col: int | None = None

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.col}"


# Source texts by file name, so errors raised far from the parser can still show
# the offending line. Filled by whoever reads a file (``remember_source``).
_SOURCES: dict[str, str] = {}


def remember_source(file: str, text: str) -> None:
    _SOURCES[file] = text


def source_line(span: Span) -> str | None:
    text = _SOURCES.get(span.file)
    if text is None:
        try:
            text = Path(span.file).read_text(encoding="utf-8", errors="replace")
        except OSError:
            return None
    lines = text.splitlines()
    if 1 <= span.line <= len(lines):
        return lines[span.line - 1]
    return None


def caret_block(span: Span) -> str:
    """The source line of ``span`` and a caret line under it (empty if unknown)."""
    line = source_line(span)
    if line is None:
        return ""
    line = line.expandtabs(1)
    start = max(span.col - 1, 0)
    if span.end_line == span.line and span.end_col and span.end_col > span.col:
        width = span.end_col - span.col
    else:
        width = 1
    width = max(1, min(width, max(len(line) - start, 1)))
    return f"    {line}\n    {' ' * start}{'^' * width}"


class PipeforgeError(Exception):
    """Base of every error pipeforge reports to a user."""

    kind = "error"

    def __init__(self, message: str, span: Span | None = None, *, notes: tuple[str, ...] = ()):
        super().__init__(message)
        self.message = message
        self.span = span
        self.notes = tuple(notes)

    @property
    def location(self) -> str | None:
        return str(self.span) if self.span else None

    def render(self) -> str:
        head = f"{self.span}: error: {self.message}" if self.span else f"error: {self.message}"
        parts = [head]
        if self.span:
            block = caret_block(self.span)
            if block:
                parts.append(block)
        parts.extend(f"note: {note}" for note in self.notes)
        return "\n".join(parts)


class PipeSyntaxError(PipeforgeError):
    """The text is not in the language (or a torch CSV cell is malformed)."""

    kind = "syntax"


class SemanticError(PipeforgeError):
    """The text parses but means nothing valid: unknown name, bad range, failed require."""

    kind = "semantic"


class UsageError(PipeforgeError):
    """A command-line argument is wrong (unknown schedule, bad -D value, bad flag combination)."""

    kind = "usage"


class VerificationError(PipeforgeError):
    """A schedule was required to be valid (codegen, optimize output) and is not."""

    kind = "verification"

    def __init__(self, message: str, report: object = None, span: Span | None = None):
        super().__init__(message, span)
        self.report = report


class CodegenError(PipeforgeError):
    """Code could not be generated for a schedule that is otherwise valid."""

    kind = "codegen"
