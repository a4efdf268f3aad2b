"""Expressions of the .pipe language, compiled once into Python closures.

``compile_expr(tree, file)`` turns a lark expression tree into a function
``env -> value`` (``env`` maps names to values). The tree is walked once; a
loop body that runs a thousand times calls closures, never lark. Errors (an
undefined name, division by zero) are ``SemanticError`` at the span of the
sub-expression that failed.

Bounded: a value is an integer of at most ``MAX_INT_BITS`` bits or a finite
float (a result beyond is an error at its place, so doubling a name in a loop
cannot grow without end), and a chain of one operator level (``a + b - c + ...``,
``a * b // c``, ``x and y and z``) is one closure over a list, so a long flat
sum needs no recursion; nesting depth is bounded when parsing (``parse.py``).
"""

from __future__ import annotations

import operator
from collections.abc import Callable

from lark import Token, Tree

from pipeforge.errors import SemanticError, Source, Span

Value = int | float  # a value of the language: an integer (a condition is a bool, an int) or a finite float
Env = dict[str, Value]
Eval = Callable[[Env], Value]


def span_of(node: Tree[Token] | Token, file: Source) -> Span:
    """The source span of a lark tree or token (end exclusive)."""
    if isinstance(node, Token):
        assert node.line is not None and node.column is not None, "lark's lexer gives every token its place"
        return file.span(node.line, node.column, node.end_line, node.end_column)
    meta = node.meta
    if getattr(meta, "empty", True):
        return file.span(1, 1)
    return file.span(meta.line, meta.column, meta.end_line, meta.end_column)


def subtree(node: Tree[Token] | Token) -> Tree[Token]:
    """A child that the grammar makes a rule (a statement, a block, a placement), checked to be a tree."""
    assert isinstance(node, Tree), f"the grammar makes a rule, not the token {node!r}, here"
    return node


def token_of(tree: Tree[Token]) -> Token:
    """The one token of a rule that holds one (a literal, a name), as the grammar writes it."""
    token = tree.children[0]
    assert isinstance(token, Token), f"the grammar's {tree.data!r} holds a token"
    return token


def describe(value: object) -> str:
    if isinstance(value, bool):
        return f"a condition ({str(value).lower()})"
    if isinstance(value, float):
        return f"the number {value!r}"
    return repr(value)


def require_int(value: object, span: Span, what: str) -> int:
    """``value`` itself when it is an integer; a SemanticError naming ``what`` otherwise."""
    if type(value) is int:
        return value
    raise SemanticError(f"{what} must be an integer, got {describe(value)}", span)


def require_number(value: object, span: Span, what: str) -> float:
    if type(value) is int or type(value) is float:
        try:
            return float(value)
        except OverflowError:
            raise SemanticError(f"{what} is too large a number", span) from None
    raise SemanticError(f"{what} must be a number, got {describe(value)}", span)


def _constant(value: Value) -> Eval:
    return lambda env: value


def _name(tree: Tree[Token], file: Source) -> Eval:
    token = tree.children[0]
    name = str(token)
    span = span_of(token, file)

    def lookup(env: Env) -> Value:
        try:
            return env[name]
        except KeyError:
            known = ", ".join(sorted(k for k in env if not k.startswith("$")))
            raise SemanticError(f"undefined name {name!r}", span,
                                notes=(f"names defined here: {known}",) if known else ()) from None

    return lookup


MAX_INT_BITS = 256  # far beyond any count a schedule means; a value past it is an error, not a slow bignum


_LIMIT = 1 << MAX_INT_BITS


def bounded(value: Value, span: Span, low: int = -_LIMIT, high: int = _LIMIT) -> Value:
    """``value`` itself when it is within the language's bounds (a number of magnitude below
    2 ** MAX_INT_BITS: not inf, not nan); a SemanticError at ``span`` otherwise."""
    if low < value < high:
        return value
    raise _too_large(value, span)


def _too_large(value: object, span: Span) -> SemanticError:
    return SemanticError(f"the result is too large a number (2 ** {MAX_INT_BITS} or more)", span)


Combine = Callable[[Value, Value, Span], Value]


def _operation(op: Callable[[Value, Value], Value], where: str) -> Combine:
    """``(a, b, span) -> op(a, b)`` with the language's errors: operands it cannot combine, results too large."""
    def combine(a: Value, b: Value, span: Span, low: int = -_LIMIT, high: int = _LIMIT) -> Value:
        try:
            value = op(a, b)
        except TypeError:
            raise SemanticError(f"cannot combine {describe(a)} and {describe(b)} {where}", span) from None
        except OverflowError:
            raise SemanticError("the result is too large a number", span) from None
        if low < value < high:  # an int below 2 ** MAX_INT_BITS, or a float also finite
            return value
        raise _too_large(value, span)

    return combine


def _divided(op: Callable[[Value, Value], Value], symbol: str, divisor_span: Span) -> Combine:
    combine = _operation(op, f"with {symbol!r}")

    def apply(a: Value, b: Value, span: Span) -> Value:
        if b == 0:
            raise SemanticError(f"division by zero: the right side of {symbol!r} is 0", divisor_span)
        return combine(a, b, span)

    return apply


# One precedence level each: a left-nested chain of these (``a + b - c``) is compiled as one list.
_LEVELS = {"add": "sum", "sub": "sum", "mul": "product", "floordiv": "product", "mod": "product",
           "and_": "and", "or_": "or"}


def _chain(tree: Tree[Token], file: Source) -> Eval:
    """``a op1 b op2 c ...`` (a left-nested tree of one level) as one loop: no recursion for its length."""
    level, links = _LEVELS[tree.data], []  # the links, outermost first
    node: Tree[Token] | Token = tree
    while isinstance(node, Tree) and _LEVELS.get(node.data) == level:
        links.append(node)
        node = node.children[0]
    first = compile_expr(node, file)
    links.reverse()
    rights = [compile_expr(link.children[1], file) for link in links]
    if level in ("and", "or"):
        return _logical(first, rights, level == "and")
    steps = [(_step(link, file), right, span_of(link, file)) for link, right in zip(links, rights)]
    if len(steps) <= _NESTED:  # the usual short chain: nested closures, one call a link
        for combine, right, span in steps:
            first = _link(first, combine, right, span)
        return first

    def apply(env: Env) -> Value:
        value = first(env)
        for combine, right, span in steps:
            value = combine(value, right(env), span)
        return value

    return apply


_NESTED = 16  # chains up to this long evaluate as nested closures (that deep at most), longer ones in a loop


def _link(left: Eval, combine: Combine, right: Eval, span: Span) -> Eval:
    return lambda env: combine(left(env), right(env), span)


def _step(link: Tree[Token], file: Source) -> Combine:
    data = link.data
    if data in ("floordiv", "mod"):
        return _divided(operator.floordiv if data == "floordiv" else operator.mod, "//" if data == "floordiv" else "%",
                        span_of(link.children[1], file))
    return _OPERATIONS[data]  # (and, or: _logical)


_OPERATIONS = {name: _operation(op, "here") for name, op in (("add", operator.add), ("sub", operator.sub),
                                                              ("mul", operator.mul))}


def _logical(first: Eval, rest: list[Eval], conjunction: bool) -> Eval:
    """``first and r1 and r2 ...`` (or ``or``): a condition, evaluated left to right, stopping early."""
    def apply(env: Env) -> bool:
        if bool(first(env)) != conjunction:
            return not conjunction
        for right in rest:
            if bool(right(env)) != conjunction:
                return not conjunction
        return conjunction

    return apply


def _compare(op: Callable[[Value, Value], bool]) -> Callable[[Tree[Token], Source], Eval]:
    def build(tree: Tree[Token], file: Source) -> Eval:
        left, right = (compile_expr(child, file) for child in tree.children)
        span = span_of(tree, file)

        def apply(env: Env) -> bool:
            try:
                return op(left(env), right(env))
            except (TypeError, OverflowError):
                raise SemanticError("these values cannot be compared", span) from None

        return apply

    return build


def _not(tree: Tree[Token], file: Source) -> Eval:
    inner = compile_expr(tree.children[0], file)
    return lambda env: not inner(env)


def _neg(tree: Tree[Token], file: Source) -> Eval:
    inner = compile_expr(tree.children[0], file)
    span = span_of(tree, file)

    def negate(env: Env) -> Value:
        value = inner(env)
        if type(value) not in (int, float):
            raise SemanticError(f"cannot negate {describe(value)}", span)
        return bounded(-value, span)

    return negate


def _extremum(pick: Callable[..., Value], name: str) -> Callable[[Tree[Token], Source], Eval]:
    def build(tree: Tree[Token], file: Source) -> Eval:
        parts = [compile_expr(child, file) for child in tree.children]
        span = span_of(tree, file)

        def apply(env: Env) -> Value:
            try:
                return pick(part(env) for part in parts)
            except TypeError:
                raise SemanticError(f"{name}() needs numbers", span) from None

        return apply

    return build


def _int_literal(tree: Tree[Token], file: Source) -> Eval:
    return _constant(bounded(int(token_of(tree)), span_of(tree, file)))


def _float_literal(tree: Tree[Token], file: Source) -> Eval:
    return _constant(bounded(float(token_of(tree)), span_of(tree, file)))


_BUILDERS: dict[str, Callable[[Tree[Token], Source], Eval]] = {
    "int_": _int_literal,
    "float_": _float_literal,
    "name": _name,
    "add": _chain,
    "sub": _chain,
    "mul": _chain,
    "floordiv": _chain,
    "mod": _chain,
    "eq": _compare(operator.eq),
    "ne": _compare(operator.ne),
    "lt": _compare(operator.lt),
    "le": _compare(operator.le),
    "gt": _compare(operator.gt),
    "ge": _compare(operator.ge),
    "and_": _chain,
    "or_": _chain,
    "not_": _not,
    "neg": _neg,
    "min_": _extremum(min, "min"),
    "max_": _extremum(max, "max"),
}


def compile_expr(tree: Tree[Token] | Token, file: Source) -> Eval:
    """A closure computing the expression ``tree`` in an environment (a child of a tree: the grammar
    wraps every token of an expression in a rule, so it is a tree)."""
    assert isinstance(tree, Tree), f"an expression is a tree, not the token {tree!r}"
    return _BUILDERS[tree.data](tree, file)
