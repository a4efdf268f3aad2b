"""The lark parser of the grammar (``grammar/pipe.lark``), built once: LALR with the contextual lexer and
``propagate_positions``, so every tree knows its span; a parse stops with ``TooManyTokens`` at the token
past ``MAX_TOKENS`` (memory grows with the tokens; ``parse.py`` words the error). The built tables are
kept between runs in the user's cache folder (``cache_folder``; ``Lark.save``), in a file named by and
starting with a digest of the grammar, the options, lark's version and Python's: any difference, or a
file that cannot be read, and the parser is built again (about 60 ms; loaded, about 8)."""

from __future__ import annotations

import contextlib
import hashlib
import os
import sys
import tempfile
from collections.abc import Iterable, Iterator
from functools import cache

import lark
from lark import Lark, Token

from pipeforge.resources import grammar_file


OPTIONS = {"parser": "lalr", "lexer": "contextual", "propagate_positions": True, "maybe_placeholders": True}


@cache
def parser() -> Lark:
    return build_parser(grammar_file().read_text(encoding="utf-8"), cache_folder())


def build_parser(grammar: str, folder: str | None) -> Lark:
    """The parser of ``grammar``, loaded from ``folder`` where a file there holds this grammar's tables, else
    built and its tables written there (whole or not at all: written to a temporary file, then renamed);
    ``folder`` None, or one that cannot be written: built, nothing kept."""
    if folder is None:
        return _lark(grammar)
    kept, key = cache_file(grammar, folder), _key(grammar).encode()
    try:
        with open(kept, "rb") as file:
            if file.readline().rstrip(b"\n") == key:
                return Lark.load(file)
    except Exception:  # noqa: BLE001 (none kept yet, or a file lark cannot read: built again, below)
        pass
    built = _lark(grammar)
    _keep(built, key, folder, kept)
    return built


def cache_file(grammar: str, folder: str) -> str:
    """The file in ``folder`` for the tables of ``grammar`` (named by its key, which it starts with)."""
    return os.path.join(folder, f"pipe-{_key(grammar)[:20]}.lark")


def _key(grammar: str) -> str:
    """What the tables depend on: the grammar, the options, lark's version and Python's."""
    return hashlib.sha256(f"{grammar}\0{sorted(OPTIONS.items())}\0{lark.__version__}\0{sys.version_info[:2]}"
                          .encode()).hexdigest()


def _keep(built: Lark, key: bytes, folder: str, kept: str) -> None:
    """``key`` and ``built``'s tables written to ``kept`` through a temporary file renamed into place, so a
    reader finds the whole file or none; nothing where the folder cannot be written."""
    try:
        os.makedirs(folder, exist_ok=True)
        handle, fresh = tempfile.mkstemp(prefix=os.path.basename(kept) + ".", suffix=".tmp", dir=folder)
    except OSError:
        return
    try:
        with os.fdopen(handle, "wb") as file:
            file.write(key + b"\n")
            built.save(file)
        os.replace(fresh, kept)
    except Exception:  # noqa: BLE001 (a full disk, a folder gone: nothing kept)
        with contextlib.suppress(OSError):
            os.remove(fresh)


def cache_folder() -> str | None:
    """``$XDG_CACHE_HOME/pipeforge``, else ``~/.cache/pipeforge``; None where neither names a folder."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "pipeforge") if os.path.isabs(base) else None


def _lark(grammar: str) -> Lark:
    return Lark(grammar, postlex=_TokenBudget(), **OPTIONS)


MAX_TOKENS = 250_000  # the canonical form (`pipeforge fmt`) of the largest schedule has a few per rank


class TooManyTokens(Exception):
    def __init__(self, token: Token) -> None:
        super().__init__(token)
        self.token = token


class _TokenBudget:
    """lark's post-lexer hook: counts the tokens of one parse, stopping at the one past ``MAX_TOKENS``."""

    always_accept = ()

    def process(self, stream: Iterable[Token]) -> Iterator[Token]:
        for count, token in enumerate(stream, start=1):
            if count > MAX_TOKENS:
                raise TooManyTokens(token)
            yield token
