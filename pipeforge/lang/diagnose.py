"""Friendly syntax errors: what was found, what was expected, and the usual mistake behind it.

Two sources of advice: rules that read the parser's stack at the failure (an
unclosed '{', a missing ',' inside a call, '=' where '==' was meant), and
lark's ``match_examples`` for mistakes that leave the parser in a state of its
own (a float parameter default, ``else if``, a loop without ``in``).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from functools import cache
from typing import cast

from lark import Token, Tree
from lark.exceptions import UnexpectedCharacters, UnexpectedInput, UnexpectedToken

from pipeforge.errors import PipeSyntaxError, Source, Span
from pipeforge.ir import ActionKind
from pipeforge.lang.braces import Brace, likely_unclosed
from pipeforge.lang.lark_parser import parser

Stack = list[Tree[Token] | Token]  # the LALR parser's value stack: what it has shifted and reduced so far

_NAMED = {
    "INT": "an integer", "FLOAT": "a number", "NAME": "a name", "STRING": "a string",
    "ACTION_TOKEN": "a torch action like 2F0", "STEP_RUN": "torch steps like 0F0", "$END": "the end of the file",
}
_FOUND = {"INT": "integer", "FLOAT": "number", "NAME": "name", "STRING": "string", "ACTION_TOKEN": "action",
          "STEP_RUN": "steps"}
_STATEMENT_STARTS = {
    "RANKS", "STAGES", "MICROBATCHES", "REQUIRE", "COSTS", "MEMORY", "LET", "FOR", "IF", "RANK", "CHAIN",
    *(kind.value for kind in ActionKind),  # an action call starts with its kind's name
    "OVERLAP", "GROUP", "IDLE", "UNDERSCORE", "ACTION_TOKEN", "STEP_RUN", "LPAR", "LSQB",
}
_OPERATORS = {"PLUS", "MINUS", "STAR", "PERCENT", "OR", "AND", "LESSTHAN", "MORETHAN"}
_EXPRESSION_STARTS = {"INT", "FLOAT", "NAME", "MINUS", "LPAR", "MIN", "MAX", "NOT"}
_CALLERS = {"action_name", "MIN", "MAX"}

_EXAMPLES = {
    "a parameter default must be an integer literal, like 'P = 4'": [
        "schedule s(P = 4.5) {}", "schedule s(P = x) {}", "schedule s(P = 2 * 3) {}", "schedule s(P) {}",
        "schedule s(P = ) {}", "schedule s(P = -x) {}",
    ],
    "'else if' is written 'elif'": ["schedule s() { if 1 { } else if 2 { } }"],
    "a loop is written 'for NAME in A .. B { ... }'": [
        "schedule s() { for m 0 .. 4 { } }", "schedule s() { for 3 in 0 .. 4 { } }",
    ],
    "expected a placement after 'placement': loop, v, reverse, or { rank: [stages], ... }": [
        "schedule s() { stages 4 placement }", "schedule s() { stages 4 placement 3 }",
        "schedule s() { stages 4 placement x }",
    ],
    "'let' binds a name with '=': let NAME = EXPR": [
        "schedule s() { let x == 3 }", "schedule s() { let x 3 }", "schedule s() { let 3 = 4 }",
    ],
    "'require' takes a condition, then ',' and a message in double quotes": [
        "schedule s() { require 1, x }", "schedule s() { require 1, 'x' }", "schedule s() { require 1, }",
    ],
    "a schedule is written 'schedule NAME(PARAM = DEFAULT, ...) { ... }' or 'schedule NAME { ... }'": [
        "schedule { }", "schedule s() ranks 4", "x", "schedule 3() {}",
    ],
}


def bad_character(error: UnexpectedCharacters, text: str, file: Source) -> PipeSyntaxError:
    # lark declares pos_in_stream None on UnexpectedInput; UnexpectedCharacters sets the lexer's position, an int
    pos = cast(int, error.pos_in_stream)
    char = text[pos] if pos < len(text) else ""
    span = file.span(error.line, error.column, error.line, error.column + 1)
    if char == '"':
        return PipeSyntaxError("unterminated string: a string must end with '\"' on the same line", span)
    if char == "'":
        return PipeSyntaxError("strings are written in double quotes: \"...\"", span)
    if char == "/":
        return PipeSyntaxError("'/' is not an operator here: integer division is '//'", span)
    if char == "." and re.search(r"\bschedule\s+\w+\s*\([^()]*=\s*-?\d+$", text[:pos]):
        return PipeSyntaxError("a parameter default must be an integer literal, like 'P = 4'", span)
    expected = _expected_text(set(error.allowed or ()))
    return PipeSyntaxError(f"unexpected character {char!r}" + (f": expected {expected}" if expected else ""), span)


def unexpected_token(error: UnexpectedToken, text: str, file: Source) -> PipeSyntaxError:
    token = error.token
    span = _token_span(token, file)
    stack = _stack(error)
    brace = _unclosed_brace(error, stack, file, text)
    if brace is not None:
        return brace
    for rule in _stack_rules():
        diagnosis = rule(error, stack, file)
        if diagnosis is not None:
            return diagnosis
    advice = _matching_example(error)
    found = _describe(token)
    if advice is not None:
        return PipeSyntaxError(f"unexpected {found}: {advice}", span)
    return PipeSyntaxError(f"unexpected {found}: expected {_expected_text(set(error.expected))}", span,
                           notes=_statement_note(error, token))


def _statement_note(error: UnexpectedToken, token: Token) -> tuple[str, ...]:
    if token.type == "NAME" and "LET" in error.expected:
        return (f"to bind a name write 'let {token} = ...'; actions are F(s, m), B, I, W or torch tokens like 0F0",)
    return ()


def _token_span(token: Token, file: Source) -> Span:
    line_given, col_given = getattr(token, "line", None), getattr(token, "column", None)
    line = line_given if isinstance(line_given, int) else 1
    col = col_given if isinstance(col_given, int) else 1
    end_col = getattr(token, "end_column", None)
    if token.type == "$END" or not isinstance(end_col, int) or getattr(token, "end_line", line) != line:
        end_col = col + max(len(str(token)), 1)
    return file.span(line, col, line, end_col)


def _stack(error: UnexpectedToken) -> Stack:
    parser = getattr(error, "interactive_parser", None)
    if parser is None:
        return []
    return list(parser.parser_state.value_stack)


def _symbol(item: object) -> str:
    if isinstance(item, Token):
        return item.type
    if isinstance(item, Tree):
        return item.data
    return ""


def _unclosed_brace(error: UnexpectedToken, stack: Stack, file: Source, text: str) -> PipeSyntaxError | None:
    if "RBRACE" not in error.expected or error.token.type not in ("$END", "SCHEDULE"):
        return None
    at_end = error.token.type == "$END"
    where = "the end of the file" if at_end else f"'schedule' at line {error.token.line}"
    suspect = likely_unclosed(text if at_end else text[:error.token.start_pos])
    if suspect is None:
        opened = _unclosed(stack, "LBRACE", "RBRACE")
        if opened is None:
            return None
        assert opened.line is not None and opened.column is not None, "lark's lexer gives every token its place"
        suspect = Brace(opened.line, opened.column, None)
    span = file.span(suspect.line, suspect.col, suspect.line, suspect.col + 1)
    if suspect.evidence_line is None:
        return PipeSyntaxError(f"this '{{' is never closed: expected '}}' before {where}", span)
    return PipeSyntaxError(f"this '{{' is never closed: expected a '}}' at this indentation before line "
                           f"{suspect.evidence_line}", span,
                           notes=(f"the parser reached {where} with a block still open",))


def _unclosed_paren(error: UnexpectedToken, stack: Stack, file: Source) -> PipeSyntaxError | None:
    if "RPAR" not in error.expected or error.token.type not in ("RBRACE", "RSQB", "$END"):
        return None
    opened = _unclosed(stack, "LPAR", "RPAR")
    if opened is None:
        return None
    return PipeSyntaxError(f"unexpected {_describe(error.token)}: expected ')' to close the '(' at "
                           f"{file}:{opened.line}:{opened.column}", _token_span(error.token, file))


def _unclosed(stack: Stack, opener: str, closer: str) -> Token | None:
    """The innermost ``opener`` token of the stack that no ``closer`` after it matches."""
    depth = 0
    for item in reversed(stack):
        symbol = _symbol(item)
        if symbol == closer:
            depth += 1
        elif symbol == opener:
            if depth == 0:
                assert isinstance(item, Token), "a terminal's name is a token's type"
                return item
            depth -= 1
    return None


def _semicolon(error: UnexpectedToken, stack: Stack, file: Source) -> PipeSyntaxError | None:
    if error.token.type != "SEMICOLON":
        return None
    return PipeSyntaxError("unexpected ';': statements are separated by spaces or new lines; ';' only joins "
                           "the actions of an overlap token like (0F7;7B3)", _token_span(error.token, file))


def _chain_keyword(error: UnexpectedToken, stack: Stack, file: Source) -> PipeSyntaxError | None:
    if error.token.type != "EQUAL" or not stack:
        return None
    last = stack[-1]
    if isinstance(last, Tree) and last.data == "name":
        last = last.children[0]
    if not isinstance(last, Token) or str(last) != "chain":
        return None
    return PipeSyntaxError("an action names its chain with '@': F@1(stage, microbatch), or inside 'chain 1 { ... }'",
                           _token_span(error.token, file))


_OPENERS = {"RPAR": "LPAR", "RSQB": "LSQB", "RBRACE": "LBRACE"}


def _stray_closer(error: UnexpectedToken, stack: Stack, file: Source) -> PipeSyntaxError | None:
    opener = _OPENERS.get(error.token.type)
    if opener is None:
        return None
    symbols = [_symbol(item) for item in stack]
    if symbols.count(opener) > symbols.count(error.token.type):
        return None
    return PipeSyntaxError(f"unexpected {_describe(error.token)}: it closes nothing, no "
                           f"{_terminal_texts()[opener]} is open here", _token_span(error.token, file))


def _double_equals_in_let(error: UnexpectedToken, stack: Stack, file: Source) -> PipeSyntaxError | None:
    symbols = [_symbol(item) for item in stack[-3:]]
    if error.token.type != "EQUAL" or symbols != ["LET", "NAME", "EQUAL"]:
        return None
    return PipeSyntaxError("'let' binds a name with a single '=': let NAME = EXPR", _token_span(error.token, file))


def _assignment_in_condition(error: UnexpectedToken, stack: Stack, file: Source) -> PipeSyntaxError | None:
    if error.token.type != "EQUAL":
        return None
    in_condition = any(_symbol(item) in ("REQUIRE", "IF", "ELIF") for item in stack[-4:])
    if not in_condition and _term("==") not in error.expected:
        return None
    return PipeSyntaxError("'=' is not a comparison: write '==' to compare (a name is bound with 'let')",
                           _token_span(error.token, file))


def _missing_comma(error: UnexpectedToken, stack: Stack, file: Source) -> PipeSyntaxError | None:
    if error.token.type not in _EXPRESSION_STARTS - {"MINUS"} or "COMMA" not in error.expected:
        return None
    opener = _innermost_open(stack)
    if opener is None:
        return None
    what = {"call": "arguments", "list": "stages", "params": "parameters"}[opener]
    return PipeSyntaxError(f"missing ',' between {what}: unexpected {_describe(error.token)}",
                           _token_span(error.token, file))


def _innermost_open(stack: Stack) -> str | None:
    """What the innermost unclosed bracket of the stack opens: a call, a stage list, or parameters."""
    symbols = [_symbol(item) for item in stack]
    for index in range(len(symbols) - 1, -1, -1):
        symbol = symbols[index]
        if symbol == "LSQB":
            return "list" if "COLON" in symbols[:index] else None
        if symbol != "LPAR":
            continue
        before = symbols[index - 1] if index else ""
        if before in _CALLERS or (before in ("int_", "name") and index >= 2 and symbols[index - 2] == "AT"):
            return "call"
        if before == "NAME" and index >= 2 and symbols[index - 2] == "SCHEDULE":
            return "params"
        return None
    return None


def _range_syntax(error: UnexpectedToken, stack: Stack, file: Source) -> PipeSyntaxError | None:
    if _term("..") not in error.expected:
        return None
    found = _describe(error.token)
    return PipeSyntaxError(f"unexpected {found}: a range is written 'A .. B' (from A up to, not including, B)",
                           _token_span(error.token, file))


def _stages_placement(error: UnexpectedToken, stack: Stack, file: Source) -> PipeSyntaxError | None:
    if "PLACEMENT" not in error.expected:
        return None
    return PipeSyntaxError(f"unexpected {_describe(error.token)}: 'stages N' needs a placement: "
                           "'stages N placement loop' (or v, reverse, { rank: [stages], ... })",
                           _token_span(error.token, file))


StackRule = Callable[[UnexpectedToken, Stack, Source], PipeSyntaxError | None]


def _stack_rules() -> tuple[StackRule, ...]:
    """Diagnoses read from the parser's stack, tried in order before the generic message."""
    return (_unclosed_paren, _stray_closer, _semicolon, _chain_keyword, _double_equals_in_let,
            _assignment_in_condition, _missing_comma, _range_syntax, _stages_placement)


class _Position:
    """A parser state compared by its LALR position only, not by its stack depth.

    lark's ``match_examples`` compares whole parser states, so an example would
    match only at the nesting depth it was written at; comparing positions lets
    one example stand for the same mistake in any block.
    """

    def __init__(self, state: object) -> None:
        self.position = getattr(state, "position", state)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Position) and self.position == other.position
    # no __hash__: a class that defines __eq__ alone is unhashable (its __hash__ is None)


def _matching_example(error: UnexpectedToken) -> str | None:
    def parse_example(text: str) -> Tree[Token]:
        try:
            return parser().parse(text)
        except UnexpectedInput as example_error:
            example_error.state = _Position(example_error.state)
            raise

    original = error.state
    error.state = _Position(original)
    try:
        return error.match_examples(parse_example, _EXAMPLES, use_accepts=False)
    except AssertionError:
        return None
    finally:
        error.state = original


@cache
def _terminal_texts() -> dict[str, str]:
    texts = dict(_NAMED)
    for terminal in parser().terminals:
        if terminal.name not in texts and terminal.pattern.type == "str":
            texts[terminal.name] = repr(terminal.pattern.value)
    return texts


def _term(value: str) -> str:
    """The lark name of the anonymous terminal spelled ``value`` (such as '..')."""
    for name, text in _terminal_texts().items():
        if text == repr(value):
            return name
    return value


def _describe(token: Token) -> str:
    if token.type == "$END":
        return "end of file"
    if token.type in _FOUND:
        return f"{_FOUND[token.type]} {str(token)!r}"
    return _terminal_texts().get(token.type, repr(str(token)))


def _expected_text(names: set[str]) -> str:
    """What the parser would have taken, in words; operators only when nothing else would do."""
    texts = _terminal_texts()
    parts: list[str] = []
    if len(names & _STATEMENT_STARTS) >= 8:
        names = names - _STATEMENT_STARTS
        parts.append("a statement")
    if {"INT", "NAME"} <= names:
        names = names - _EXPRESSION_STARTS
        parts.append("an expression")
    operators = names & (_OPERATORS | {_term(op) for op in ("==", "!=", "<=", ">=", "//")})
    if operators and (parts or names - operators):
        names = names - operators
    elif len(operators) >= 4:
        names = names - operators
        parts.append("an operator")
    parts.extend(sorted(texts.get(name, name) for name in names))
    if len(parts) > 1:
        return ", ".join(parts[:-1]) + " or " + parts[-1]
    return parts[0] if parts else "something else"
