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

import unicodedata
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property


@dataclass(frozen=True)
class Source:
    """A text as it was read, with the name it is shown under (a path, or ``<string>``).

    Spans refer to their Source, so an error shows the line of the very text it
    came from: no table of texts by name, and no file read again at render time.
    """

    name: str
    text: str = field(repr=False)

    def __str__(self) -> str:
        return self.name

    @cached_property
    def lines(self) -> tuple[str, ...]:
        """The lines as lark counts them: split at ``\\n`` only (a form feed, a lone ``\\r`` or U+2028
        stays inside its line), the ``\\r`` of ``\\r\\n`` left out."""
        lines = self.text.split("\n")
        if lines and not lines[-1]:
            lines.pop()
        return tuple(line.removesuffix("\r") for line in lines)

    def line(self, number: int) -> str | None:
        """The text of the 1-based line ``number`` (as in ``lines``), or None past the end; found by
        counting newlines, so an error in a file of millions of lines does not split it."""
        text = self.text
        if number < 1 or not text:
            return None
        start: int | None = 0
        if number > 1:
            start = _after_newline(text, number - 1)
            if start is None or start == len(text):
                return None
        end = text.find("\n", start)
        return text[start:end if end >= 0 else len(text)].removesuffix("\r")

    def span(self, line: int, col: int, end_line: int | None = None, end_col: int | None = None) -> Span:
        return Span(self.name, line, col, end_line, end_col, self)


def _after_newline(text: str, count: int) -> int | None:
    """The offset just after the ``count``-th ``\\n`` of ``text`` (None when it has fewer): a bisection
    over ``str.count``, in C, with no list of lines."""
    if text.count("\n") < count:
        return None
    low, high = 0, len(text)  # text[:high] holds at least count newlines
    while low < high:
        middle = (low + high) // 2
        if text.count("\n", 0, middle + 1) >= count:
            high = middle
        else:
            low = middle + 1
    return low + 1


_set_attribute = object.__setattr__


@dataclass(frozen=True)
class Span:
    """A region of a source text: 1-based line and column, end exclusive.

    ``source`` (left out of equality and repr) is the text the position refers to;
    a span built without one names its place but shows no caret.
    """

    file: str
    line: int
    col: int
    end_line: int | None = None
    end_col: int | None = None
    source: Source | None = field(default=None, compare=False, repr=False)

    def __init__(self, file: str, line: int, col: int, end_line: int | None = None, end_col: int | None = None,
                 source: Source | None = None):
        # what the frozen dataclass's own __init__ does, with the names bound once: a span is made per
        # CSV cell, and attributes set one by one keep it one small object (no dict of its own)
        _set_attribute(self, "file", file)
        _set_attribute(self, "line", line)
        _set_attribute(self, "col", col)
        _set_attribute(self, "end_line", end_line)
        _set_attribute(self, "end_col", end_col)
        _set_attribute(self, "source", source)

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.col}"


def source_line(span: Span) -> str | None:
    return span.source.line(span.line) if span.source is not None else None


def printable_char(char: str) -> str:
    """``char`` itself, or its escape (``\\x1b``, ``\\u2028``) when a terminal or XML would act on it:
    control and format characters (ESC, bidi overrides) and line or paragraph separators."""
    if char == "\t" or (" " <= char <= "~") or unicodedata.category(char) not in _UNPRINTABLE:
        return char
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


_UNPRINTABLE = {"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"}


def printable(text: str, keep: str = "") -> str:
    """``text`` with every character ``printable_char`` escapes escaped, except those in ``keep``."""
    if text.isascii() and text.isprintable():
        return text
    return "".join(char if char in keep else printable_char(char) for char in text)


def caret_block(span: Span) -> str:
    """The source line of ``span`` (control characters escaped) and a caret line under it (empty if unknown)."""
    line = source_line(span)
    if line is None:
        return ""
    shown = [printable_char(char) if char != "\t" else " " for char in line]
    start = max(span.col - 1, 0)
    if span.end_line == span.line and span.end_col and span.end_col > span.col:
        width = span.end_col - span.col
    else:
        width = 1
    width = max(1, min(width, max(len(line) - start, 1)))
    first, last = _window(len(shown), start, width)
    shown = (["..."] if first else []) + shown[first:last] + (["..."] if last < len(line) else [])
    start -= first - (1 if first else 0)
    indent = sum(map(len, shown[:start])) + max(0, start - len(shown))
    marked = max(1, sum(map(len, shown[start:start + min(width, last - first)])))
    return f"    {''.join(shown)}\n    {' ' * indent}{'^' * marked}"


SHOWN_COLUMNS = 120  # of a long source line, the part around the caret that is echoed


def _window(length: int, start: int, width: int) -> tuple[int, int]:
    """The range of a line of ``length`` characters echoed under an error at ``start``: all of it when short."""
    if length <= SHOWN_COLUMNS:
        return 0, length
    first = max(0, min(start - SHOWN_COLUMNS // 3, length - SHOWN_COLUMNS))
    return first, min(length, first + max(SHOWN_COLUMNS, min(width, SHOWN_COLUMNS)))


@dataclass(frozen=True)
class Argument:
    """An argument of a library call, named inside an error message.

    ``keyword`` is the Python keyword (``defines``, ``schedule``, ``stages``,
    ``microbatches``, ``placement``, ``costs``, ``memory_limit``, ``strategy``);
    ``item`` the entry inside it that is meant (a parameter name, a cost item);
    ``value`` the value given, as text. The library words it as Python does
    (``defines['Q']``, ``stages=3``); the command line words it as the flag a user
    typed (``-D Q``, ``--stages 3``: ``pipeforge.commands.wording``).
    """

    keyword: str
    item: str | None = None
    value: str | None = None

    def __str__(self) -> str:
        if self.item is not None and self.keyword == "defines":
            return f"{self.keyword}[{self.item!r}]"
        if self.item is not None:
            return f"{self.keyword} item {self.item!r}"
        return self.keyword if self.value is None else f"{self.keyword}={self.value}"


Part = str | Argument


@dataclass(frozen=True)
class Words:
    """A message that names arguments: text and ``Argument`` parts, worded on demand."""

    parts: tuple[Part, ...]

    def __str__(self) -> str:
        return self.worded(str)

    def worded(self, name: Callable[[Argument], str]) -> str:
        return "".join(part if isinstance(part, str) else name(part) for part in self.parts)


def words(*parts: Part) -> Words:
    return Words(parts)


class PipeforgeError(Exception):
    """Base of every error pipeforge reports to a user.

    ``message`` is plain text, or ``Words`` when it names arguments of the call
    (then ``render(name)`` can word them as something else, such as flags).
    """

    kind = "error"

    def __init__(self, message: str | Words, span: Span | None = None, *, notes: tuple[str, ...] = ()):
        super().__init__(str(message))
        self.words = message if isinstance(message, Words) else Words((message,))
        self.message = str(message)
        self.span = span
        self.notes = tuple(notes)

    @property
    def location(self) -> str | None:
        return str(self.span) if self.span else None

    def __reduce__(self):  # pickled with its fields, whatever the subclass's constructor takes
        return _rebuilt, (type(self), self.message, self.__dict__)

    def worded(self, name: Callable[[Argument], str] = str) -> str:
        """The message with every argument named by ``name`` (Python's names by default)."""
        return self.words.worded(name)

    def render(self, name: Callable[[Argument], str] = str) -> str:
        message = self.worded(name)
        head = f"{self.span}: error: {message}" if self.span else f"error: {message}"
        parts = [head]
        if self.span:
            block = caret_block(self.span)
            if block:
                parts.append(block)
        parts.extend(f"note: {note}" for note in self.notes)
        return printable("\n".join(parts), keep="\n")  # a name or message from a file cannot drive the terminal


def _rebuilt(cls: type[PipeforgeError], message: str, state: dict) -> PipeforgeError:
    error = cls.__new__(cls)
    Exception.__init__(error, message)
    error.__dict__.update(state)
    return error


class PipeSyntaxError(PipeforgeError):
    """The text is not in the language (or a torch CSV cell is malformed)."""

    kind = "syntax"


class SemanticError(PipeforgeError):
    """The text parses but means nothing valid: unknown name, bad range, failed require."""

    kind = "semantic"


class UsageError(PipeforgeError):
    """A call is wrong: an unknown schedule, a bad argument value, arguments that do not go together."""

    kind = "usage"


class ArgumentError(UsageError):
    """The value of one argument is wrong: which argument, the value given, what is wrong with it.

    ``argument`` is an ``Argument``; ``problem`` says what is wrong in words that
    name no flag. The message is ``argument: problem`` unless ``message`` words it
    otherwise (it may name other arguments too).
    """

    def __init__(self, argument: Argument, problem: str | Words, *, value: object = None,
                 message: Words | None = None, span: Span | None = None):
        super().__init__(message or words(argument, ": ", *_parts(problem)), span)
        self.argument = argument
        self.problem = str(problem)
        self.value = value


def _parts(text: str | Words) -> tuple[Part, ...]:
    return text.parts if isinstance(text, Words) else (text,)


class VerificationError(PipeforgeError):
    """A schedule was required to be valid (codegen, optimize output) and is not."""

    kind = "verification"

    def __init__(self, message: str, report: object = None, span: Span | None = None):
        super().__init__(message, span)
        self.report = report


class CodegenError(PipeforgeError):
    """Code could not be generated for a schedule that is otherwise valid."""

    kind = "codegen"
