"""Schedule-level statements: ranks, stages and placements, microbatches, require, costs, memory.

Each ``build_*`` takes a lark tree and returns a closure ``(Elaboration, env) -> None``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

from lark import Token, Tree

from pipeforge.errors import SemanticError, Source, Span
from pipeforge.ir import CostModel, MemorySpec, Placement, StepOverhead, cost_fields, cost_problem
from pipeforge.lang.context import MAX_COUNT, Elaboration
from pipeforge.lang.exprs import Env, Eval, compile_expr, require_int, require_number, span_of, subtree
from pipeforge.semantics import weight_grad_problem

Exec = Callable[[Elaboration, Env], None]
PlacementBuilder = Callable[[Elaboration, Env, int], Placement]
StageList = Callable[[Env], list[tuple[int, Span]]]  # a placement entry's stages, each with its place
PlacementItem = Callable[[Elaboration, Env], Iterable[tuple[int, Span, list[tuple[int, Span]]]]]
Given = tuple[str | int, ...]  # a setting of a costs or memory block: (key,) or (key, stage or link)
CostEntry = Callable[[Elaboration, Env, dict[str, float], list[tuple[int, str, float]], dict[int, float],
                     dict[Given, Span]], None]
MemoryEntry = tuple[str, tuple[Eval, Span] | None, Eval, Span]  # key, its index [s] if given, value


def positive_count(value: object, span: Span, what: str) -> int:
    count = require_int(value, span, f"the number of {what}")
    if count <= 0:
        raise SemanticError(f"the number of {what} must be positive, got {count}", span)
    if count > MAX_COUNT:
        raise SemanticError(f"the number of {what} must be at most {MAX_COUNT}, got {count}", span)
    return count


def _build_count(what: str) -> Callable[[Tree[Token], Source], Exec]:
    """A builder for ``ranks N`` or ``microbatches N``: a positive count declared once."""

    def build(tree: Tree[Token], file: Source) -> Exec:
        count = compile_expr(tree.children[0], file)
        span, count_span = span_of(tree, file), span_of(tree.children[0], file)

        def declare(ctx: Elaboration, env: Env) -> None:
            ctx.declare(what, span)
            setattr(ctx, what, positive_count(count(env), count_span, what))

        return declare

    return build


build_ranks = _build_count("ranks")
build_microbatches = _build_count("microbatches")


def build_stages(tree: Tree[Token], file: Source) -> Exec:
    count = compile_expr(tree.children[0], file)
    placements = [_build_placement(subtree(child), file) for child in tree.children[1:]]
    span, count_span = span_of(tree, file), span_of(tree.children[0], file)

    def declare_stages(ctx: Elaboration, env: Env) -> None:
        ctx.declare("stages", span)
        ctx.require_declared(("ranks",), span, "'stages'")
        ctx.stages = stages = positive_count(count(env), count_span, "stages")
        ctx.placements = tuple(build(ctx, env, stages) for build in placements)

    return declare_stages


def reverse_placement(stages: int, ranks: int) -> Placement:
    """Stage s on rank P-1-(s % P): the loop placement mirrored (the second chain of Chimera, DualPipe)."""
    return Placement(tuple(ranks - 1 - s % ranks for s in range(stages)))


def _build_placement(tree: Tree[Token], file: Source) -> PlacementBuilder:
    if tree.data == "place_loop":
        return lambda ctx, env, stages: Placement.loop(stages, ctx.rank_count)
    if tree.data == "place_v":
        return lambda ctx, env, stages: Placement.v(stages, ctx.rank_count)
    if tree.data == "place_reverse":
        return lambda ctx, env, stages: reverse_placement(stages, ctx.rank_count)
    return _build_explicit_placement(tree, file)


def _build_explicit_placement(tree: Tree[Token], file: Source) -> PlacementBuilder:
    items = [_build_placement_item(subtree(item), file) for item in tree.children if item is not None]
    span = span_of(tree, file)

    def explicit(ctx: Elaboration, env: Env, stages: int) -> Placement:
        mapping: list[int | None] = [None] * stages
        for item in items:
            for rank, rank_span, owned in item(ctx, env):
                _check_rank(ctx, rank, rank_span)
                for stage, stage_span in owned:
                    _assign(mapping, stage, rank, stage_span)
        missing = [s for s, r in enumerate(mapping) if r is None]
        if missing:
            raise SemanticError(f"the placement gives no rank to stage(s) {', '.join(map(str, missing))}", span)
        return Placement(tuple(rank for rank in mapping if rank is not None))  # none is None: checked above

    return explicit


def _build_placement_item(tree: Tree[Token], file: Source) -> PlacementItem:
    """``rank: [stages]`` or ``for NAME in A .. B: [stages]``: a function yielding (rank, span, stages)."""
    if tree.data == "place_entry":
        rank_of, rank_span = compile_expr(tree.children[0], file), span_of(tree.children[0], file)
        stages_of = _build_stage_list(subtree(tree.children[1]), file)
        return lambda ctx, env: [(require_int(rank_of(env), rank_span, "a rank"), rank_span, stages_of(env))]
    name = str(tree.children[0])
    start, stop = (compile_expr(t, file) for t in tree.children[1:3])
    spans = [span_of(t, file) for t in tree.children[:3]]
    stages_of = _build_stage_list(subtree(tree.children[3]), file)

    def each_rank(ctx: Elaboration, env: Env) -> Iterator[tuple[int, Span, list[tuple[int, Span]]]]:
        first = require_int(start(env), spans[1], "the start of a range")
        last = require_int(stop(env), spans[2], "the end of a range")
        ctx.spend(max(0, min(last - first, MAX_COUNT + 1)), spans[0])
        for rank in range(first, last):
            yield rank, spans[0], stages_of({**env, name: rank})

    return each_rank


def _build_stage_list(tree: Tree[Token], file: Source) -> StageList:
    stages = [(compile_expr(s, file), span_of(s, file)) for s in tree.children if s is not None]
    return lambda env: [(require_int(stage_of(env), s_span, "a stage"), s_span) for stage_of, s_span in stages]


def _check_rank(ctx: Elaboration, rank: int, span: Span) -> None:
    ranks = ctx.rank_count
    if not 0 <= rank < ranks:
        raise SemanticError(f"the placement names rank {rank}, but this schedule has ranks 0..{ranks - 1}", span)


def _assign(mapping: list[int | None], stage: int, rank: int, span: Span) -> None:
    if not 0 <= stage < len(mapping):
        raise SemanticError(f"the placement names stage {stage}, but this schedule has stages "
                            f"0..{len(mapping) - 1}", span)
    if mapping[stage] is not None:
        raise SemanticError(f"the placement gives stage {stage} twice (to rank {mapping[stage]} and rank {rank})",
                            span)
    mapping[stage] = rank


def build_require(tree: Tree[Token], file: Source) -> Exec:
    condition = compile_expr(tree.children[0], file)
    message = str(tree.children[1])[1:-1] if tree.children[1] is not None else "requirement not met"
    span = span_of(tree, file)

    def check_requirement(ctx: Elaboration, env: Env) -> None:
        if condition(env):
            return
        values = f" ({ctx.parameter_text()})" if ctx.params else ""
        raise SemanticError(f"requirement failed: {message}{values}", span)

    return check_requirement


_COST_KEYS = cost_fields()  # F, I, W, B, comm


def build_costs(tree: Tree[Token], file: Source) -> Exec:
    entries = [_build_cost_entry(subtree(entry), file) for entry in tree.children]
    span = span_of(tree, file)

    def declare_costs(ctx: Elaboration, env: Env) -> None:
        ctx.declare("costs", span)
        fields: dict[str, float] = {}
        per_stage: list[tuple[int, str, float]] = []
        links: dict[int, float] = {}
        given: dict[Given, Span] = {}
        for entry in entries:
            entry(ctx, env, fields, per_stage, links, given)
        ctx.costs = CostModel(**fields, per_stage=tuple(per_stage), links=_dense(links, fields.get("comm", 0.0)),
                              overhead=StepOverhead())  # a costs block gives no step overhead

    return declare_costs


def given_once(given: dict[Given, Span], key: Given, span: Span, what: str) -> None:
    """Refuse a setting given twice in one block, as a declaration declared twice is (both places named)."""
    first = given.setdefault(key, span)
    if first is not span:
        raise SemanticError(f"{what} is given twice", span, notes=(f"first given at {first}",))


def _dense(entries: dict[int, float], default: float) -> tuple[float, ...]:
    """``{index: value}`` as a tuple up to the last index given, ``default`` in the gaps."""
    return tuple(entries.get(i, default) for i in range(max(entries) + 1)) if entries else ()


def _build_cost_entry(tree: Tree[Token], file: Source) -> CostEntry:
    key_tree, index_tree, value_tree = tree.children
    key = str(subtree(key_tree).children[0])
    key_span = span_of(key_tree, file)
    if key not in _COST_KEYS:
        raise SemanticError(f"unknown cost {key!r}: costs are {', '.join(_COST_KEYS)}", key_span)
    value = compile_expr(value_tree, file)
    value_span = span_of(value_tree, file)
    index = (compile_expr(index_tree, file), span_of(index_tree, file)) if index_tree is not None else None

    def set_cost(ctx: Elaboration, env: Env, fields: dict[str, float], per_stage: list[tuple[int, str, float]],
                 links: dict[int, float], given: dict[Given, Span]) -> None:
        number = require_number(value(env), value_span, f"the cost {key}")
        if not number >= 0:
            raise SemanticError(f"the cost {key} must not be negative, got {number!r}", value_span)
        problem = cost_problem(number)
        if problem is not None:
            raise SemanticError(f"the cost {key}: {problem}", value_span)
        if index is None:
            given_once(given, (key,), key_span, f"the cost {key}")
            fields[key] = number
            return
        index_of, index_span = index
        ctx.require_declared(("stages",), index_span, f"the cost {key}[s]")
        if key == "comm":
            link = _check_link(ctx, require_int(index_of(env), index_span, "a link"), index_span)
            given_once(given, (key, link), index_span, f"the cost comm[{link}]")
            links[link] = number
            return
        stage = ctx.check_stage(require_int(index_of(env), index_span, "a stage"), index_span)
        given_once(given, (key, stage), index_span, f"the cost {key}[{stage}]")  # F[1] and F[P - 1] alike
        per_stage.append((stage, key, number))

    return set_cost


def _check_link(ctx: Elaboration, link: int, span: Span) -> int:
    stages = ctx.stage_count
    if 0 <= link < stages - 1:
        return link
    raise SemanticError(f"link {link} is out of range: comm[s] is the link from stage s to s + 1, "
                        f"so s is in 0..{stages - 2}", span)


_MEMORY_KEYS = ("limit", "weights", "unsharded", "checkpoint")
_MEMORY_STAGE_KEYS = ("activation", "weight_grad", "checkpoint")


def build_memory(tree: Tree[Token], file: Source) -> Exec:
    entries = [_memory_entry(subtree(entry), file) for entry in tree.children]
    span = span_of(tree, file)

    def declare_memory(ctx: Elaboration, env: Env) -> None:
        ctx.declare("memory", span)
        fields: dict[str, float] = {}
        per_stage: dict[str, dict[int, float]] = {key: {} for key in _MEMORY_STAGE_KEYS}
        given: dict[Given, Span] = {}
        for key, index, value, value_span in entries:
            number = require_number(value(env), value_span, f"the memory {key}")
            if index is None:
                given_once(given, (key,), value_span, f"the memory {key}")
                fields[key] = number
                continue
            index_of, index_span = index
            problem = weight_grad_problem(number) if key == "weight_grad" else None
            if problem is not None:
                raise SemanticError(f"the memory {key}[s]: {problem}", value_span)
            if not 0.0 <= number < float("inf"):
                raise SemanticError(f"{key}[s] is in units of M_B: finite and at least 0, got {number!r}",
                                    value_span)
            ctx.require_declared(("stages",), index_span, f"the memory {key}[s]")
            stage = ctx.check_stage(require_int(index_of(env), index_span, "a stage"), index_span)
            given_once(given, (key, stage), index_span, f"the memory {key}[{stage}]")
            per_stage[key][stage] = number
        _check_memory(fields, {key: value_span for key, _, _, value_span in entries})
        activation = _dense(per_stage["activation"], 1.0)
        weights = fields.get("weights", 0.5)
        weight_grad = tuple(per_stage["weight_grad"].get(s, weights * (activation[s] if s < len(activation) else 1.0))
                            for s in range(max(per_stage["weight_grad"]) + 1)) if per_stage["weight_grad"] else ()
        checkpoints = _dense(per_stage["checkpoint"], fields.get("checkpoint", 0.0))
        ctx.memory = MemorySpec(**fields, activation=activation, weight_grad=weight_grad, checkpoints=checkpoints)

    return declare_memory


def _memory_entry(entry: Tree[Token], file: Source) -> MemoryEntry:
    key_tree, index_tree, value_tree = entry.children
    key, key_span = str(key_tree), span_of(key_tree, file)
    if index_tree is None and key not in _MEMORY_KEYS:
        raise SemanticError(f"unknown memory setting {key!r}: settings are {', '.join(_MEMORY_KEYS)}, "
                            f"and per stage {', '.join(k + '[s]' for k in _MEMORY_STAGE_KEYS)}", key_span)
    if index_tree is not None and key not in _MEMORY_STAGE_KEYS:
        raise SemanticError(f"{key!r} has no per-stage form; per-stage memory is "
                            f"{', '.join(k + '[s]' for k in _MEMORY_STAGE_KEYS)}", key_span)
    index = (compile_expr(index_tree, file), span_of(index_tree, file)) if index_tree is not None else None
    return key, index, compile_expr(value_tree, file), span_of(value_tree, file)


def _check_memory(fields: dict[str, float], spans: dict[str, Span]) -> None:
    if "limit" in fields and not fields["limit"] > 0:
        raise SemanticError(f"the memory limit must be positive, got {fields['limit']!r}", spans["limit"])
    problem = weight_grad_problem(fields["weights"]) if "weights" in fields else None
    if problem is not None:
        raise SemanticError(f"the memory weights: {problem}", spans["weights"])
    if "checkpoint" in fields and not 0.0 <= fields["checkpoint"] < float("inf"):
        raise SemanticError(f"checkpoint is what a recomputed forward keeps, in units of M_B: finite and at "
                            f"least 0, got {fields['checkpoint']!r}", spans["checkpoint"])
    if "unsharded" in fields and not 0.0 <= fields["unsharded"] < float("inf"):
        raise SemanticError(f"unsharded is the size of one stage's gathered parameters in units of M_B: "
                            f"finite and at least 0, got {fields['unsharded']!r}", spans["unsharded"])
