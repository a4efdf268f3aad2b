"""Where the shipped grammar, templates and library files live.

An installed wheel carries ``grammar/`` and ``templates/`` inside the package
(see ``setup.py``); a source checkout or an editable install keeps them at the
top of the repository. Both are looked up here and nowhere else.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent


@cache
def resource_dir(name: str) -> Path:
    """The folder ``name`` (``grammar`` or ``templates``), inside the package or beside it."""
    for candidate in (PACKAGE / name, PACKAGE.parent / name):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError(f"pipeforge is installed without its {name!r} folder")


def grammar_file() -> Path:
    return resource_dir("grammar") / "pipe.lark"


def templates_dir() -> Path:
    return resource_dir("templates")


def library_dir() -> Path:
    return PACKAGE / "library"
