"""Statements compiled into closures ``(Elaboration, env) -> None``.

Control flow (let, for, if, rank and chain blocks) and everything that emits a
step (action calls, overlap and group blocks, idle; torch tokens are in
``tokens.py``). Each step carries the span of the call or token that produced it.
"""

from __future__ import annotations

from collections.abc import Callable

from lark import Token, Tree

from pipeforge.errors import SemanticError, Source, Span
from pipeforge.ir import ActionKind, Step, make_action
from pipeforge.lang.programs import IMPLICIT_KINDS
from pipeforge.lang import declarations, tokens
from pipeforge.lang.context import Elaboration
from pipeforge.lang.exprs import Env, compile_expr, require_int, span_of, subtree

Exec = Callable[[Elaboration, Env], None]


def compile_body(tree: Tree[Token], file: Source) -> Exec:
    """One closure running the statements of a ``{ ... }`` body in order."""
    statements = tuple(compile_statement(subtree(child), file) for child in tree.children)
    if len(statements) == 1:
        return statements[0]

    def run_body(ctx: Elaboration, env: Env) -> None:
        for statement in statements:
            statement(ctx, env)

    return run_body


def compile_statement(tree: Tree[Token], file: Source) -> Exec:
    return _BUILDERS[tree.data](tree, file)


def _let(tree: Tree[Token], file: Source) -> Exec:
    name = str(tree.children[0])
    value = compile_expr(tree.children[1], file)

    def bind(ctx: Elaboration, env: Env) -> None:
        env[name] = value(env)

    return bind


def _for(tree: Tree[Token], file: Source) -> Exec:
    name_token, start_tree, stop_tree, step_tree, body_tree = tree.children
    name = str(name_token)
    start, stop = compile_expr(start_tree, file), compile_expr(stop_tree, file)
    step = compile_expr(step_tree, file) if step_tree is not None else None
    spans = [span_of(t, file) for t in (start_tree, stop_tree, step_tree or tree)]
    body = compile_body(subtree(body_tree), file)
    span = span_of(tree, file)

    def loop(ctx: Elaboration, env: Env) -> None:
        first = require_int(start(env), spans[0], "the start of a range")
        last = require_int(stop(env), spans[1], "the end of a range")
        stride = 1 if step is None else require_int(step(env), spans[2], "the step of a range")
        if stride == 0:
            raise SemanticError("the step of a range must not be 0", spans[2])
        values = range(first, last, stride)
        ctx.spend(iteration_count(values), span)
        for value in values:
            scope = dict(env)
            scope[name] = value
            body(ctx, scope)

    return loop


def iteration_count(values: range) -> int:
    try:
        return len(values)
    except OverflowError:  # more than sys.maxsize: beyond any budget
        return 1 << 62


def _if(tree: Tree[Token], file: Source) -> Exec:
    children = tree.children
    branches = [(compile_expr(children[0], file), compile_body(subtree(children[1]), file))]
    for clause in children[2:-1]:
        parts = subtree(clause).children
        branches.append((compile_expr(parts[0], file), compile_body(subtree(parts[1]), file)))
    otherwise = compile_body(subtree(children[-1]), file) if children[-1] is not None else None

    def choose(ctx: Elaboration, env: Env) -> None:
        for condition, body in branches:
            if condition(env):
                body(ctx, dict(env))
                return
        if otherwise is not None:
            otherwise(ctx, dict(env))

    return choose


def _rank_block(tree: Tree[Token], file: Source) -> Exec:
    target, body_tree = (subtree(child) for child in tree.children)
    body = compile_body(body_tree, file)
    span = span_of(tree, file)
    header = file.span(span.line, span.col, target.meta.end_line, target.meta.end_column)
    binder = str(target.children[0]) if target.data == "name" else None
    rank_of = compile_expr(target, file)
    rank_span = span_of(target, file)

    def run_rank(ctx: Elaboration, env: Env, rank: int) -> None:
        ctx.open_rank(rank, header)
        scope = dict(env)
        if binder is not None:
            scope[binder] = rank
        body(ctx, scope)
        ctx.close_rank()

    def rank_block(ctx: Elaboration, env: Env) -> None:
        ctx.require_declared(("ranks", "stages", "microbatches"), header, "a rank block")
        if binder is not None and binder not in env:
            ctx.spend(ctx.rank_count, span)
            for rank in range(ctx.rank_count):
                run_rank(ctx, env, rank)
            return
        run_rank(ctx, env, require_int(rank_of(env), rank_span, "a rank"))

    return rank_block


def _chain_block(tree: Tree[Token], file: Source) -> Exec:
    chain_of = compile_expr(tree.children[0], file)
    chain_span = span_of(tree.children[0], file)
    body = compile_body(subtree(tree.children[1]), file)

    def on_chain(ctx: Elaboration, env: Env) -> None:
        ctx.require_declared(("stages",), chain_span, "a chain block")
        outer = ctx.chain
        ctx.chain = ctx.check_chain(require_int(chain_of(env), chain_span, "a chain"), chain_span)
        body(ctx, dict(env))
        ctx.chain = outer

    return on_chain


def _idle(tree: Tree[Token], file: Source) -> Exec:
    span = span_of(tree, file)
    step = Step((), False, span)

    def emit_idle(ctx: Elaboration, env: Env) -> None:
        if ctx.sink is None:
            raise ctx.outside_rank("an idle slot", span)
        ctx.sink.append(step)

    return emit_idle


def _collect(kind: str, accepts: Callable[[Step], bool], shape: str) -> Callable[[Tree[Token], Source], Exec]:
    """``overlap { ... }`` or ``group { ... }``: the body's steps fused into one step."""

    def build(tree: Tree[Token], file: Source) -> Exec:
        body = compile_body(subtree(tree.children[0]), file)
        span = span_of(tree, file)
        header = file.span(span.line, span.col, span.line, span.col + len(kind))

        def fuse(ctx: Elaboration, env: Env) -> None:
            if ctx.sink is None:
                raise ctx.outside_rank(f"{_article(kind)} {kind} block", header)
            outer, ctx.sink = ctx.sink, []
            body(ctx, dict(env))
            inner, ctx.sink = ctx.sink, outer
            ctx.sink.append(_fused(kind, inner, accepts, shape, header, span))

        return fuse

    return build


def _article(word: str) -> str:
    return "an" if word[0] in "aeiou" else "a"


def _fused(kind: str, steps: list[Step], accepts: Callable[[Step], bool], shape: str, header: Span,
           span: Span) -> Step:
    if not steps:
        raise SemanticError(f"this {kind} block holds no action", header)
    for step in steps:
        if not accepts(step):
            raise SemanticError(f"{step} cannot be part of {_article(kind)} {kind} block: it holds {shape}",
                                step.span or header)
    actions = tuple(action for step in steps for action in step.actions)
    return Step(actions, kind == "overlap", span)


def _action_call(tree: Tree[Token], file: Source) -> Exec:
    name_tree, chain_tree, *arg_trees = tree.children
    kind = ActionKind(str(subtree(name_tree).children[0]))
    args = [arg for arg in arg_trees if arg is not None]
    span = span_of(tree, file)
    _check_arity(kind, len(args), span)
    stage_of, stage_span = compile_expr(args[0], file), span_of(args[0], file)
    microbatch_of = compile_expr(args[1], file) if len(args) > 1 else None
    microbatch_span = span_of(args[1], file) if len(args) > 1 else span
    chain_of = compile_expr(chain_tree, file) if chain_tree is not None else None
    chain_span = span_of(chain_tree, file) if chain_tree is not None else span
    takes_microbatch = kind.has_microbatch
    is_compute = kind.is_compute

    def emit_action(ctx: Elaboration, env: Env) -> None:
        program, sink = ctx.program, ctx.sink
        if program is None or sink is None:  # both None, or neither: outside a rank block
            raise ctx.outside_rank(f"{kind.value}(...)", span)
        stage = stage_of(env)
        if type(stage) is not int or not 0 <= stage < ctx.stage_count:  # (the checks' common case inline)
            stage = ctx.check_stage(require_int(stage, stage_span, "a stage"), stage_span)
        chain = ctx.chain if chain_of is None else ctx.check_chain(
            require_int(chain_of(env), chain_span, "a chain"), chain_span)
        microbatch = None
        if microbatch_of is not None:
            microbatch = microbatch_of(env)
            if type(microbatch) is not int or not 0 <= microbatch < ctx.microbatch_count:
                microbatch = ctx.check_microbatch(require_int(microbatch, microbatch_span, "a microbatch"),
                                                  microbatch_span)
        elif takes_microbatch:
            microbatch = program.implicit_microbatch(kind, stage, chain, ctx.microbatch_count, span)
        ctx.actions_left -= 1
        if ctx.actions_left < 0:
            raise ctx.too_many_actions(span)
        action = make_action((stage, kind, microbatch, chain))
        if is_compute:
            program.recorded.append(action)
        sink.append(Step((action,), False, span))

    return emit_action


def _check_arity(kind: ActionKind, count: int, span: Span) -> None:
    expected: tuple[int, ...]
    if kind in IMPLICIT_KINDS:
        expected, usage = (1, 2), f"{kind.value}(stage) or {kind.value}(stage, microbatch)"
    elif kind.has_microbatch:
        expected, usage = (2,), f"{kind.value}(stage, microbatch)"
    else:
        expected, usage = (1,), f"{kind.value}(stage)"
    if count not in expected:
        raise SemanticError(f"{kind.value} takes {' or '.join(map(str, expected))} argument(s), got {count}: "
                            f"write {usage}", span)


def _is_compute_step(step: Step) -> bool:
    return step.is_compute


def _is_comm_step(step: Step) -> bool:
    return step.is_group


_BUILDERS: dict[str, Callable[[Tree[Token], Source], Exec]] = {
    "ranks_decl": declarations.build_ranks,
    "stages_decl": declarations.build_stages,
    "microbatches_decl": declarations.build_microbatches,
    "require": declarations.build_require,
    "costs": declarations.build_costs,
    "memory": declarations.build_memory,
    "let": _let,
    "for_loop": _for,
    "if_chain": _if,
    "rank_block": _rank_block,
    "chain_block": _chain_block,
    "action_call": _action_call,
    "overlap": _collect("overlap", _is_compute_step, "no compute action"),
    "group": _collect("group", _is_comm_step, "no communication action"),
    "idle": _idle,
    "token_run": tokens.compile_run,
    "token_single": tokens.compile_bracketed,
    "token_overlap": tokens.compile_bracketed,
    "token_group": tokens.compile_bracketed,
}
