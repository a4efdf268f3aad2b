"""The lark parser of the grammar (``grammar/pipe.lark``), built once: LALR with the contextual lexer and
``propagate_positions``, so every tree knows its span."""

from __future__ import annotations

from functools import cache

from lark import Lark

from pipeforge.resources import grammar_file


@cache
def parser() -> Lark:
    return Lark(
        grammar_file().read_text(encoding="utf-8"),
        parser="lalr",
        lexer="contextual",
        propagate_positions=True,
        maybe_placeholders=True,
        cache=False,
    )
