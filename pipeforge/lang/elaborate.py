"""From a syntax tree to Schedules: parameters, defines, and running the compiled body.

A file is compiled once (``compile_file``) into ``CompiledSchedule`` values; each
can then be elaborated with any parameter values, cheaply, since its body is a
tree of closures rather than a lark tree.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from lark import Token, Tree

from pipeforge.errors import (Argument, ArgumentError, PipeforgeError, PipeSyntaxError, SemanticError, Source, Span,
                              UsageError, words)
from pipeforge.ir import Schedule
from pipeforge.lang.context import Elaboration
from pipeforge.lang.exprs import span_of, subtree, token_of
from pipeforge.lang.statements import Exec, compile_body


@dataclass(frozen=True)
class CompiledSchedule:
    """One ``schedule NAME(params) { ... }`` of a file, ready to elaborate."""

    name: str
    params: tuple[tuple[str, int], ...]
    span: Span
    body: Exec = field(repr=False, compare=False)
    source: Source | None = field(default=None, repr=False, compare=False)

    def elaborate(self, defines: dict[str, int] | None = None) -> Schedule:
        values = self.bind(defines or {})
        ctx = Elaboration(self.name, self.source, values)
        self.body(ctx, dict(values))
        return ctx.finish(self.span)

    def bind(self, defines: dict[str, int]) -> tuple[tuple[str, int], ...]:
        """Parameter values: the defaults, overridden by ``defines`` (unknown names refused)."""
        names = [name for name, _ in self.params]
        unknown = [name for name in defines if name not in names]
        if unknown:
            listed = ", ".join(names) if names else "none"
            raise ArgumentError(Argument("defines", unknown[0]),
                                f"schedule {self.name!r} has no parameter {unknown[0]!r} (its parameters: {listed})")
        for name, value in defines.items():
            if type(value) is not int:
                raise ArgumentError(Argument("defines", name), f"the value must be an integer, got {value!r}",
                                    value=value)
        return tuple((name, defines.get(name, default)) for name, default in self.params)


def compile_file(tree: Tree[Token], file: Source) -> tuple[CompiledSchedule, ...]:
    """Every schedule of a parsed file, compiled; duplicate names refused."""
    compiled: list[CompiledSchedule] = []
    seen: dict[str, Span] = {}
    for node in tree.children:
        schedule = compile_schedule(subtree(node), file)
        if schedule.name in seen:
            raise SemanticError(f"schedule {schedule.name!r} is defined twice in this file", schedule.span,
                                notes=(f"first defined at {seen[schedule.name]}",))
        seen[schedule.name] = schedule.span
        compiled.append(schedule)
    return tuple(compiled)


def compile_schedule(tree: Tree[Token], file: Source) -> CompiledSchedule:
    name_token, *param_trees, body_tree = tree.children
    params: list[tuple[str, int]] = []
    for param in (subtree(p) for p in param_trees if p is not None):
        name = str(param.children[0])
        if any(name == existing for existing, _ in params):
            raise SemanticError(f"parameter {name!r} is given twice", span_of(param, file))
        params.append((name, _int_literal(subtree(param.children[1]))))
    return CompiledSchedule(str(name_token), tuple(params), span_of(name_token, file),
                            compile_body(subtree(body_tree), file), file)


def _int_literal(tree: Tree[Token]) -> int:
    value = int(token_of(tree))
    return -value if tree.data == "negative_int" else value


def pick(schedules: tuple[CompiledSchedule, ...], name: str | None, file: Source) -> CompiledSchedule:
    """The schedule called ``name``, or the only one; a UsageError listing the names otherwise."""
    names = ", ".join(s.name for s in schedules)
    if not schedules:
        raise PipeSyntaxError("this file holds no schedule: expected 'schedule NAME(PARAMS) { ... }'",
                              file.span(1, 1))
    if name is None:
        if len(schedules) > 1:
            raise UsageError(words(f"{file} holds several schedules ({names}): pick one with ",
                                   Argument("schedule", value="NAME")))
        return schedules[0]
    for schedule in schedules:
        if schedule.name == name:
            return schedule
    raise UsageError(f"{file} has no schedule {name!r} (it holds: {names})")


def elaborate(schedule: CompiledSchedule, defines: dict[str, int] | None = None) -> Schedule:
    """Run a compiled schedule; deep recursion (absurd nesting) becomes a SemanticError too."""
    try:
        return schedule.elaborate(defines)
    except PipeforgeError:
        raise
    except RecursionError:
        raise SemanticError("the schedule nests too deeply to elaborate", schedule.span) from None
