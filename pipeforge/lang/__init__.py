"""The .pipe language: parse (lark), elaborate (parameters, loops) into a Schedule, print back.

    load_file(path, defines={"P": 8}, schedule=None) -> Schedule
    load_text(text, defines=None, schedule=None, filename="<string>") -> Schedule
    schedule_names(text_or_path) -> list[str]
    held_schedules(head) -> "schedule 'x'" | None   (what a file at an output path holds, without lark)
    parameters(path_or_text, schedule=None) -> list[(name, default)]
    default_offsets(text, schedule=None) -> list[(name, default, (start, end))]
    printer.print_schedule(schedule) -> str   (canonical .pipe text of any IR)

A file is parsed and compiled once (cached by its text); elaborating it again with other defines is
cheap. The language, chains included: ``docs/language.md``.
"""

from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path

from lark import Tree

from pipeforge.errors import PipeSyntaxError, Source
from pipeforge.files import read_bounded, without_bom
from pipeforge.ir import Schedule
from pipeforge.lang.elaborate import CompiledSchedule, compile_file, elaborate, pick
from pipeforge.lang.parse import parse_text

__all__ = ["load_file", "load_text", "schedule_names", "held_schedules", "parameters", "default_offsets",
           "compile_text", "compile_source", "CompiledSchedule"]


def load_text(text: str, *, defines: dict[str, int] | None = None, schedule: str | None = None,
              filename: str = "<string>") -> Schedule:
    """Elaborate the schedule ``schedule`` (or the only one) of ``text``."""
    source = Source(filename, text)
    return elaborate(pick(compile_source(source), schedule, source), defines)


def load_file(path: str | Path, *, defines: dict[str, int] | None = None, schedule: str | None = None) -> Schedule:
    """Elaborate a schedule of the .pipe file at ``path``."""
    return load_text(_read(path), defines=defines, schedule=schedule, filename=str(path))


def schedule_names(text_or_path: str | Path) -> list[str]:
    """The names of the schedules a file (or a text) holds, in order."""
    return [s.name for s in compile_source(_source_of(text_or_path))]


_HEADER = re.compile(rb"^(?:\xef\xbb\xbf)?[ \t]*schedule[ \t]+([A-Za-z_][A-Za-z0-9_]*)[ \t]*(?:\([^()]*\))?\s*\{",
                     re.MULTILINE)  # (a file may start with a byte-order mark, files.BOM)


def held_schedules(head: bytes) -> str | None:
    """The schedules the .pipe text ``head`` (a file's first bytes) defines, in words (``schedule 'a'``,
    ``schedules 'a', 'b'``), read from their headers without parsing the rest; None when it holds none.
    Two .pipe files are the same output when these words are (``files.check_replaceable``)."""
    names = [match.group(1).decode("ascii") for match in _HEADER.finditer(head)]
    if not names:
        return None
    return f"schedule{'s' if len(names) > 1 else ''} {', '.join(map(repr, names))}"


def parameters(path_or_text: str | Path, schedule: str | None = None) -> list[tuple[str, int]]:
    """The parameters of a schedule and their defaults, in order."""
    source = _source_of(path_or_text)
    return list(pick(compile_source(source), schedule, source).params)


def default_offsets(text: str, schedule: str | None = None,
                    filename: str = "<string>") -> list[tuple[str, int, tuple[int, int]]]:
    """Each parameter with its default and the character offsets of that default in ``text``.

    For tools that rewrite defaults in place (``pipeforge new -D``) without
    reprinting the rest of the source.
    """
    source = Source(filename, text)
    chosen = pick(compile_source(source), schedule, source)
    tree = next(node for node in parse_text(source).children
                if isinstance(node, Tree) and str(node.children[0]) == chosen.name)  # (each is a schedule)
    literals = [param.children[1] for param in tree.children[1:-1] if isinstance(param, Tree)]  # (or None)
    found = []
    for (name, default), literal in zip(chosen.params, literals):
        assert isinstance(literal, Tree), "a parameter's default is the grammar's int_literal rule"
        found.append((name, default, (literal.meta.start_pos, literal.meta.end_pos)))
    return found


def compile_text(text: str, filename: str = "<string>") -> tuple[CompiledSchedule, ...]:
    """Every schedule of ``text``, parsed and compiled (cached: same text, same result)."""
    return compile_source(Source(filename, text))


@lru_cache(maxsize=64)
def compile_source(source: Source) -> tuple[CompiledSchedule, ...]:
    """Every schedule of ``source``; its spans refer to ``source`` (cached by name and text)."""
    try:
        return compile_file(parse_text(source), source)
    except RecursionError:
        raise PipeSyntaxError("the text nests too deeply to compile", source.span(1, 1)) from None


def _read(path: str | Path) -> str:
    data = without_bom(read_bounded(path, "schedule file"))
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise _not_utf8(str(path), data, error) from None


def _not_utf8(file: str, data: bytes, error: UnicodeDecodeError) -> PipeSyntaxError:
    """A PipeSyntaxError at the first byte that is not UTF-8."""
    prefix = data[:error.start].decode("utf-8", errors="replace")
    line = prefix.count("\n") + 1
    col = len(prefix) - (prefix.rfind("\n") + 1) + 1
    source = Source(file, data.decode("utf-8", errors="replace"))
    return PipeSyntaxError(f"not UTF-8 text (byte 0x{data[error.start]:02x}); a .pipe file is UTF-8",
                           source.span(line, col, line, col + 1))


def _source_of(text_or_path: str | Path) -> Source:
    if isinstance(text_or_path, Path):
        return Source(str(text_or_path), _read(text_or_path))
    if "\n" not in text_or_path and "{" not in text_or_path:
        return Source(text_or_path, _read(text_or_path))
    return Source("<string>", text_or_path.removeprefix("\ufeff"))  # a text read with its byte-order mark
