"""The lark parser of .pipe files, and its errors turned into PipeSyntaxError.

The grammar (``grammar/pipe.lark``) is loaded once: LALR with the contextual
lexer and ``propagate_positions`` so every tree knows its span. Lark's
exceptions stop here: ``parse_text`` raises only ``PipeSyntaxError``, whose
message says what was expected, with friendly wording for common mistakes
(see ``diagnose.py``).
"""

from __future__ import annotations

from lark import Tree
from lark.exceptions import UnexpectedCharacters, UnexpectedInput, UnexpectedToken

from pipeforge.errors import PipeSyntaxError, Source
from pipeforge.lang import diagnose
from pipeforge.lang.lark_parser import parser


def parse_text(source: Source) -> Tree:
    """The syntax tree of ``source``; a PipeSyntaxError with a span when it is not in the language."""
    try:
        return parser().parse(source.text)
    except UnexpectedInput as error:
        raise to_syntax_error(error, source.text, source) from None
    except RecursionError:
        raise PipeSyntaxError("the text nests too deeply to parse", source.span(1, 1)) from None


def to_syntax_error(error: UnexpectedInput, text: str, file: Source) -> PipeSyntaxError:
    if isinstance(error, UnexpectedCharacters):
        return diagnose.bad_character(error, text, file)
    if isinstance(error, UnexpectedToken):
        return diagnose.unexpected_token(error, text, file)
    line, col = getattr(error, "line", 1), getattr(error, "column", 1)
    return PipeSyntaxError("unexpected end of file", file.span(line if line != "?" else 1, col if col != "?" else 1))
