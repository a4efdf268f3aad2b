"""The syntax tree of a .pipe text; lark's errors turned into PipeSyntaxError.

``parse_text`` raises only ``PipeSyntaxError``, with friendly wording for common
mistakes (``diagnose.py``). Bounded (docs/language.md, Bounds): at most
``MAX_TOKENS`` tokens, ``MAX_ACTIONS`` torch steps in runs, ``MAX_DEPTH`` levels
of nesting (a flat chain such as ``a + b + c`` counts once) and ``MAX_INT_DIGITS``
digits an integer; past one, the error is at the place that goes past it, and
no later walk of the tree depends on Python's recursion limit.
"""

from __future__ import annotations

from lark import Token, Tree
from lark.exceptions import UnexpectedCharacters, UnexpectedInput, UnexpectedToken

from pipeforge.errors import PipeSyntaxError, Source, Span
from pipeforge.lang import diagnose
from pipeforge.lang.context import MAX_ACTIONS
from pipeforge.lang.exprs import span_of
from pipeforge.lang.lark_parser import MAX_TOKENS, TooManyTokens, parser


MAX_DEPTH = 100
MAX_INT_DIGITS = 78  # 2 ** 256 has 78 digits (pipeforge.lang.exprs.MAX_INT_BITS)

# A left-nested chain of one operator level is compiled as one list (exprs._chain): it adds no depth.
_CHAINS = {"add": "sum", "sub": "sum", "mul": "product", "floordiv": "product", "mod": "product",
           "and_": "and", "or_": "or"}


def parse_text(source: Source) -> Tree[Token]:
    """The syntax tree of ``source``; a PipeSyntaxError with a span when it is not in the language."""
    try:
        tree = parser().parse(source.text)
    except UnexpectedInput as error:
        raise to_syntax_error(error, source.text, source) from None
    except RecursionError:
        raise PipeSyntaxError("the text nests too deeply to parse", source.span(1, 1)) from None
    except TooManyTokens as stop:
        raise PipeSyntaxError(f"this text has more than {MAX_TOKENS} tokens; write long explicit programs as "
                              "runs of torch steps ('0F0 1F0 _ ...', as 'pipeforge fmt' prints them)",
                              _span(stop.token, source)) from None
    check_bounds(tree, source)
    return tree


def check_bounds(tree: Tree[Token], source: Source) -> None:
    """Refuse (PipeSyntaxError at its place) nesting deeper than MAX_DEPTH or a too long integer; iterative."""
    stack: list[tuple[Tree[Token], int]] = [(tree, 0)]
    steps = 0
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
            elif isinstance(child, Token) and child.type == "STEP_RUN":
                steps += len(child.split())  # about one a step (a group's actions count each): a bound, cheaply
                if steps > MAX_ACTIONS:
                    raise PipeSyntaxError(f"this text writes more than {MAX_ACTIONS} torch steps, more than a "
                                        "schedule may emit", _span(child, source))


def _span(node: Tree[Token] | Token, source: Source) -> Span:
    if isinstance(node, Token):
        return span_of(node, source)
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
