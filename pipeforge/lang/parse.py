"""The lark parser of .pipe files, and its errors turned into PipeSyntaxError.

The grammar (``grammar/pipe.lark``) is loaded once: LALR with the contextual
lexer and ``propagate_positions`` so every tree knows its span. Lark's
exceptions stop here: ``parse_text`` raises only ``PipeSyntaxError``, whose
message says what was expected, with friendly wording for common mistakes
(see ``diagnose.py``).

Bounded: a text nesting more than ``MAX_DEPTH`` levels (blocks, parentheses,
operators; a chain of one operator level such as a flat sum counts once) or
holding an integer literal of more than ``MAX_INT_DIGITS`` digits is refused at
the place that goes past the bound, so no later walk of the tree depends on
Python's recursion limit.
"""

from __future__ import annotations

from lark import Token, Tree
from lark.exceptions import UnexpectedCharacters, UnexpectedInput, UnexpectedToken

from pipeforge.errors import PipeSyntaxError, Source, Span
from pipeforge.lang import diagnose
from pipeforge.lang.lark_parser import parser

MAX_DEPTH = 100
MAX_INT_DIGITS = 78  # 2 ** 256 has 78 digits (pipeforge.lang.exprs.MAX_INT_BITS)

# A left-nested chain of one operator level is compiled as one list (exprs._chain): it adds no depth.
_CHAINS = {"add": "sum", "sub": "sum", "mul": "product", "floordiv": "product", "mod": "product",
           "and_": "and", "or_": "or"}


def parse_text(source: Source) -> Tree:
    """The syntax tree of ``source``; a PipeSyntaxError with a span when it is not in the language."""
    try:
        tree = parser().parse(source.text)
    except UnexpectedInput as error:
        raise to_syntax_error(error, source.text, source) from None
    except RecursionError:
        raise PipeSyntaxError("the text nests too deeply to parse", source.span(1, 1)) from None
    check_bounds(tree, source)
    return tree


def check_bounds(tree: Tree, source: Source) -> None:
    """Refuse (PipeSyntaxError at its place) nesting deeper than MAX_DEPTH or a too long integer; iterative."""
    stack: list[tuple[Tree, int]] = [(tree, 0)]
    while stack:
        node, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise PipeSyntaxError(f"this nests more than {MAX_DEPTH} levels deep (blocks, parentheses and "
                                  "operators); split it with 'let'", _span(node, source))
        level = _CHAINS.get(node.data)
        for index, child in enumerate(node.children):
            if isinstance(child, Tree):
                same_chain = index == 0 and level is not None and _CHAINS.get(child.data) == level
                stack.append((child, depth if same_chain else depth + 1))
            elif isinstance(child, Token) and child.type == "INT" and len(child) > MAX_INT_DIGITS:
                raise PipeSyntaxError(f"this integer has {len(child)} digits; at most {MAX_INT_DIGITS} "
                                      "(256 bits) are read", _span(child, source))


def _span(node: Tree | Token, source: Source) -> Span:
    if isinstance(node, Token):
        return source.span(node.line, node.column, node.end_line, node.end_column)
    meta = node.meta
    if getattr(meta, "empty", True):
        return source.span(1, 1)
    return source.span(meta.line, meta.column, meta.line, meta.column + 1)


def to_syntax_error(error: UnexpectedInput, text: str, file: Source) -> PipeSyntaxError:
    if isinstance(error, UnexpectedCharacters):
        return diagnose.bad_character(error, text, file)
    if isinstance(error, UnexpectedToken):
        return diagnose.unexpected_token(error, text, file)
    line, col = getattr(error, "line", 1), getattr(error, "column", 1)
    return PipeSyntaxError("unexpected end of file", file.span(line if line != "?" else 1, col if col != "?" else 1))
