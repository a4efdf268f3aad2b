"""The lark parser of the grammar (``grammar/pipe.lark``), built once: LALR with the contextual lexer and
``propagate_positions``, so every tree knows its span; a parse stops with ``TooManyTokens`` at the token
past ``MAX_TOKENS`` (memory grows with the tokens; ``parse.py`` words the error)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from functools import cache

from lark import Lark, Token

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
        postlex=_TokenBudget(),
    )


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
