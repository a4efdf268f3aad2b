"""The built-in schedules: one parametric ``.pipe`` file each, named by its file.

    names()                          -> ['1f1b', 'chimera', ...]
    describe('1f1b')                 -> ('One forward, ...', [('P', 4), ('M', 8)])
    load_library_schedule('1f1b', {'P': 8})
    source_with_defaults('1f1b', {'P': 8})   # the file, with P = 8 as its default

A file's first line is its description, its header its parameters; ``GENERATED`` names the schedules
a module builds instead (``v-half``). What the tests hold each schedule to (torch's orders, bubble
rates): ``docs/library.md``.
"""

from __future__ import annotations

from dataclasses import replace
from functools import cache
from importlib import import_module
from pathlib import Path

from pipeforge.errors import Argument, ArgumentError, UsageError
from pipeforge.ir import Schedule
from pipeforge.lang import default_offsets, load_text, schedule_names
from pipeforge.lang.printer import print_schedule
from pipeforge.resources import library_dir

SUFFIX = ".pipe"


GENERATED = {"v-half": "pipeforge.library.v_half"}  # name -> the module that builds it


def names() -> list[str]:
    """Every library schedule, sorted."""
    return sorted([file.name[: -len(SUFFIX)] for file in library_dir().glob(f"*{SUFFIX}")] + list(GENERATED))


def path(name: str) -> Path:
    """The ``.pipe`` file of library schedule ``name`` (for a generated one, the module that builds it);
    a UsageError listing the names if there is none."""
    if name not in names():
        raise UsageError(f"no library schedule {name!r}; the library holds: {', '.join(names())}")
    if name in GENERATED:
        return Path(_generator(name).__file__)
    return library_dir() / f"{name}{SUFFIX}"


def source(name: str) -> str:
    if name in GENERATED:
        return source_with_defaults(name)
    return path(name).read_text(encoding="utf-8")


def describe(name: str) -> tuple[str, list[tuple[str, int]]]:
    """The one-line description and the parameters with their defaults."""
    if name in GENERATED:
        module = _generator(name)
        return module.DESCRIPTION, list(module.PARAMETERS)
    text = source(name)
    return description_of(text), [(param, default) for param, default, _ in _parameters(name, text)]


def description_of(text: str) -> str:
    first = text.splitlines()[0] if text else ""
    return first.lstrip("#").strip() if first.startswith("#") else ""


def load_library_schedule(name: str, defines: dict[str, int] | None = None) -> Schedule:
    """Library schedule ``name`` elaborated with ``defines`` over its defaults."""
    if name in GENERATED:
        return _build(name, defines or {})
    return load_text(source(name), defines=defines or {}, filename=str(path(name)))


def source_with_defaults(name: str, defines: dict[str, int] | None = None) -> str:
    """The schedule's source with ``defines`` written in as its new defaults.

    The result elaborates, with no defines, to what ``load_library_schedule(name,
    defines)`` gives; defines the schedule refuses (an unknown name, a failing
    ``require``) raise the same errors as they would there.
    """
    defines = defines or {}
    if name in GENERATED:
        return _generated_source(name, defines)
    load_library_schedule(name, defines)  # refuse what the schedule refuses, with its own message
    text = source(name)
    edits = sorted(((start, end, str(defines[param])) for param, _, (start, end) in _parameters(name, text)
                    if param in defines), reverse=True)
    for start, end, value in edits:
        text = text[:start] + value + text[end:]
    return text


def _parameters(name: str, text: str) -> tuple[tuple[str, int, tuple[int, int]], ...]:
    """(parameter, default, (start, end) offsets of the default in ``text``) of the file's schedule."""
    return _header_parameters(str(path(name)), text)


@cache
def _header_parameters(file: str, text: str) -> tuple[tuple[str, int, tuple[int, int]], ...]:
    names = schedule_names(text)
    if len(names) != 1:
        raise UsageError(f"{file}: a library file holds exactly one schedule, found {len(names)}")
    return tuple(default_offsets(text, filename=file))


# --- schedules built by a module ---------------------------------------------------------


def _generator(name: str):
    return import_module(GENERATED[name])


def _build(name: str, defines: dict[str, int]) -> Schedule:
    module = _generator(name)
    known = dict(module.PARAMETERS)
    unknown = sorted(set(defines) - set(known))
    if unknown:
        raise ArgumentError(Argument("defines", unknown[0]),
                            f"library schedule {name!r} has no parameter {unknown[0]!r}; "
                            f"its parameters are {', '.join(known)}")
    return module.build(**{**known, **defines})


def _generated_source(name: str, defines: dict[str, int]) -> str:
    """The built schedule as explicit .pipe source: its description, the values it was built for, no parameters."""
    schedule = _build(name, defines)
    values = " ".join(f"{param}={value}" for param, value in schedule.params)
    flags = " ".join(f"-D {param}=..." for param, _ in schedule.params)
    header = (f"# {_generator(name).DESCRIPTION}\n"
              f"# built for {values} by pipeforge (pipeforge new {name} {flags} builds another)\n")
    return header + print_schedule(replace(schedule, params=()))
