"""Expressions of the .pipe language, compiled once into Python closures.

``compile_expr(tree, file)`` turns a lark expression tree into a function
``env -> value`` (``env`` maps names to values). The tree is walked once; a
loop body that runs a thousand times calls closures, never lark. Errors (an
undefined name, division by zero) are ``SemanticError`` at the span of the
sub-expression that failed.
"""

from __future__ import annotations

import operator
from collections.abc import Callable

from lark import Token, Tree

from pipeforge.errors import SemanticError, Source, Span

Env = dict
Eval = Callable[[Env], object]


def span_of(node: Tree | Token, file: Source) -> Span:
    """The source span of a lark tree or token (end exclusive)."""
    if isinstance(node, Token):
        return file.span(node.line, node.column, node.end_line, node.end_column)
    meta = node.meta
    if getattr(meta, "empty", True):
        return file.span(1, 1)
    return file.span(meta.line, meta.column, meta.end_line, meta.end_column)


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
    if type(value) in (int, float):
        try:
            return float(value)
        except OverflowError:
            raise SemanticError(f"{what} is too large a number", span) from None
    raise SemanticError(f"{what} must be a number, got {describe(value)}", span)


def _constant(value: object) -> Eval:
    return lambda env: value


def _name(tree: Tree, file: Source) -> Eval:
    token = tree.children[0]
    name = str(token)
    span = span_of(token, file)

    def lookup(env: Env) -> object:
        try:
            return env[name]
        except KeyError:
            known = ", ".join(sorted(k for k in env if not k.startswith("$")))
            raise SemanticError(f"undefined name {name!r}", span,
                                notes=(f"names defined here: {known}",) if known else ()) from None

    return lookup


def _combine(op: Callable[[object, object], object], a: object, b: object, where: str, span: Span) -> object:
    """``op(a, b)``, with the language's errors for operands it cannot combine and results too large."""
    try:
        return op(a, b)
    except TypeError:
        raise SemanticError(f"cannot combine {describe(a)} and {describe(b)} {where}", span) from None
    except OverflowError:
        raise SemanticError("the result is too large a number", span) from None


def _arithmetic(op: Callable[[object, object], object]) -> Callable[[Tree, Source], Eval]:
    def build(tree: Tree, file: Source) -> Eval:
        left, right = (compile_expr(child, file) for child in tree.children)
        span = span_of(tree, file)

        def apply(env: Env) -> object:
            return _combine(op, left(env), right(env), "here", span)

        return apply

    return build


def _division(op: Callable[[object, object], object], symbol: str) -> Callable[[Tree, Source], Eval]:
    def build(tree: Tree, file: Source) -> Eval:
        left, right = (compile_expr(child, file) for child in tree.children)
        span = span_of(tree, file)
        divisor_span = span_of(tree.children[1], file)

        def apply(env: Env) -> object:
            a, b = left(env), right(env)
            if b == 0:
                raise SemanticError(f"division by zero: the right side of {symbol!r} is 0", divisor_span)
            return _combine(op, a, b, f"with {symbol!r}", span)

        return apply

    return build


def _compare(op: Callable[[object, object], bool]) -> Callable[[Tree, Source], Eval]:
    def build(tree: Tree, file: Source) -> Eval:
        left, right = (compile_expr(child, file) for child in tree.children)
        span = span_of(tree, file)

        def apply(env: Env) -> bool:
            try:
                return op(left(env), right(env))
            except (TypeError, OverflowError):
                raise SemanticError("these values cannot be compared", span) from None

        return apply

    return build


def _and(tree: Tree, file: Source) -> Eval:
    left, right = (compile_expr(child, file) for child in tree.children)
    return lambda env: bool(left(env)) and bool(right(env))


def _or(tree: Tree, file: Source) -> Eval:
    left, right = (compile_expr(child, file) for child in tree.children)
    return lambda env: bool(left(env)) or bool(right(env))


def _not(tree: Tree, file: Source) -> Eval:
    inner = compile_expr(tree.children[0], file)
    return lambda env: not inner(env)


def _neg(tree: Tree, file: Source) -> Eval:
    inner = compile_expr(tree.children[0], file)
    span = span_of(tree, file)

    def negate(env: Env) -> object:
        value = inner(env)
        if type(value) not in (int, float):
            raise SemanticError(f"cannot negate {describe(value)}", span)
        return -value

    return negate


def _extremum(pick: Callable[..., object], name: str) -> Callable[[Tree, Source], Eval]:
    def build(tree: Tree, file: Source) -> Eval:
        parts = [compile_expr(child, file) for child in tree.children]
        span = span_of(tree, file)

        def apply(env: Env) -> object:
            try:
                return pick(part(env) for part in parts)
            except TypeError:
                raise SemanticError(f"{name}() needs numbers", span) from None

        return apply

    return build


def _int_literal(tree: Tree, file: Source) -> Eval:
    return _constant(int(tree.children[0]))


def _float_literal(tree: Tree, file: Source) -> Eval:
    return _constant(float(tree.children[0]))


_BUILDERS: dict[str, Callable[[Tree, Source], Eval]] = {
    "int_": _int_literal,
    "float_": _float_literal,
    "name": _name,
    "add": _arithmetic(operator.add),
    "sub": _arithmetic(operator.sub),
    "mul": _arithmetic(operator.mul),
    "floordiv": _division(operator.floordiv, "//"),
    "mod": _division(operator.mod, "%"),
    "eq": _compare(operator.eq),
    "ne": _compare(operator.ne),
    "lt": _compare(operator.lt),
    "le": _compare(operator.le),
    "gt": _compare(operator.gt),
    "ge": _compare(operator.ge),
    "and_": _and,
    "or_": _or,
    "not_": _not,
    "neg": _neg,
    "min_": _extremum(min, "min"),
    "max_": _extremum(max, "max"),
}


def compile_expr(tree: Tree, file: Source) -> Eval:
    """A closure computing the expression ``tree`` in an environment."""
    return _BUILDERS[tree.data](tree, file)
