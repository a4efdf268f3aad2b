"""Torch tokens written verbatim in a rank block: ``0F0 (0F7;7B3) [0SEND_F1 0RECV_B0] _ 2F0@1``.

The lexer reads a whole run of such steps as one token (``STEP_RUN``), so a
canonical file with thousands of steps costs one lark token per line rather
than one per bracket and action. Here a run is split into steps, each with its
own span, parsed once at compile time; at elaboration time its actions are
range-checked and appended. Spans of single actions are computed only for an
error message.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from lark import Token, Tree

from pipeforge.errors import PipeSyntaxError, Source, Span
from pipeforge.ir import Action, Step, parse_action
from pipeforge.lang.context import Elaboration
from pipeforge.lang.exprs import Env, span_of, token_of

Exec = Callable[[Elaboration, Env], None]

_STEP = re.compile(r"\([^)]*\)|\[[^\]]*\]|[^\s()\[\]]+")
_ACTION = re.compile(r"[^\s;()\[\]]+")


_ACTIONS: dict[str, Action] = {}


def _action(text: str) -> Action:
    """``parse_action``, remembered: canonical files repeat the same tokens rank after rank."""
    action = _ACTIONS.get(text)
    if action is None:
        if len(_ACTIONS) > 1 << 16:
            _ACTIONS.clear()
        action = _ACTIONS[text] = parse_action(text)
    return action


class _Locator:
    """Line and column of offsets inside a run, from the run's own start.

    Offsets asked for in increasing order cost a scan of the text between them;
    an earlier offset restarts from the run's start (only error messages do that).
    """

    def __init__(self, token: Token, file: Source) -> None:
        assert token.line is not None and token.column is not None, "lark's lexer gives every token its place"
        self.file, self.text = file, str(token)
        self.line, self.col = token.line, token.column
        self._offset, self._line, self._line_start = 0, token.line, -token.column + 1

    def position(self, offset: int) -> tuple[int, int]:
        if offset < self._offset:
            self._offset, self._line, self._line_start = 0, self.line, -self.col + 1
        newlines = self.text.count("\n", self._offset, offset)
        if newlines:
            self._line += newlines
            self._line_start = self.text.rindex("\n", self._offset, offset) + 1
        self._offset = offset
        return self._line, offset - self._line_start + 1

    def span(self, start: int, end: int) -> Span:
        line, col = self.position(start)
        end_line, end_col = self.position(end)
        return self.file.span(line, col, end_line, end_col)


def _run_steps(token: Token, file: Source) -> list[tuple[Step, tuple[tuple[Action, int, int], ...]]]:
    """Each step of a run with its actions and their offsets in the run."""
    locator = _Locator(token, file)
    steps: list[tuple[Step, tuple[tuple[Action, int, int], ...]]] = []
    for match in _STEP.finditer(locator.text):
        step_text, start, end = match.group(), match.start(), match.end()
        span = locator.span(start, end)
        if step_text == "_":
            steps.append((Step((), False, span), ()))
        elif step_text[0] not in "([":
            located = (_located_action(locator, start, step_text),)
            steps.append((Step((located[0][0],), False, span), located))
        else:
            steps.append(_bracketed_step(locator, step_text, start, span))
    return steps


def _bracketed_step(locator: _Locator, step_text: str, start: int,
                    span: Span) -> tuple[Step, tuple[tuple[Action, int, int], ...]]:
    located = tuple(_located_action(locator, start + part.start(), part.group())
                    for part in _ACTION.finditer(step_text))
    try:
        return Step(tuple(action for action, _, _ in located), step_text.startswith("("), span), located
    except ValueError as error:
        raise PipeSyntaxError(str(error), span) from None


def _located_action(locator: _Locator, start: int, text: str) -> tuple[Action, int, int]:
    try:
        return _action(text), start, start + len(text)
    except ValueError as error:
        raise PipeSyntaxError(str(error), locator.span(start, start + len(text))) from None


def compile_run(tree: Tree[Token], file: Source) -> Exec:
    token = token_of(tree)
    locator = _Locator(token, file)
    steps = _run_steps(token, file)
    first_span = steps[0][0].span
    assert first_span is not None, "_run_steps gives each step its span"

    def emit_run(ctx: Elaboration, env: Env) -> None:
        program, sink = ctx.program, ctx.sink
        if program is None or sink is None:  # both None, or neither: outside a rank block
            raise ctx.outside_rank(f"the step {steps[0][0]}", first_span)
        ctx.actions_left -= len(steps)
        if ctx.actions_left < 0:
            raise ctx.too_many_actions(first_span)
        record = program.record
        stages, microbatches, chains = ctx.stage_count, ctx.microbatch_count, ctx.chain_count
        for step, located in steps:
            for action, start, end in located:
                mb = action.microbatch
                if not (action.stage < stages and action.chain < chains and (mb is None or mb < microbatches)):
                    ctx.check_action(action, locator.span(start, end))
                if action.kind.is_compute:
                    record(action)
            sink.append(step)

    return emit_run


def compile_bracketed(tree: Tree[Token], file: Source) -> Exec:
    """A single token, or an overlap or group that the run did not take (kept for its error messages)."""
    action_tokens = [token for token in tree.children if isinstance(token, Token)]  # each child, by the grammar
    actions = tuple(_single_action(token, file) for token in action_tokens)
    spans = tuple(span_of(token, file) for token in action_tokens)
    span = span_of(tree, file)
    try:
        step = Step(actions, tree.data == "token_overlap", span)
    except ValueError as error:
        raise PipeSyntaxError(str(error), span) from None

    def emit_tokens(ctx: Elaboration, env: Env) -> None:
        program, sink = ctx.program, ctx.sink
        if program is None or sink is None:  # both None, or neither: outside a rank block
            raise ctx.outside_rank(f"the step {step}", span)
        for action, action_span in zip(actions, spans):
            ctx.check_action(action, action_span)
            if action.is_compute:
                program.record(action)
        sink.append(step)

    return emit_tokens


def _single_action(token: Token, file: Source) -> Action:
    try:
        return _action(str(token))
    except ValueError as error:
        raise PipeSyntaxError(str(error), span_of(token, file)) from None
