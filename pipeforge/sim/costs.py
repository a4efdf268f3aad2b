"""Cost models: resolving the one to use, reading ``--cost`` text, and fast duration lookups."""

from __future__ import annotations

from dataclasses import fields, replace
from typing import Any, cast

from pipeforge.errors import Argument, ArgumentError
from pipeforge.ir import COMPUTE_KINDS, ActionKind, CostModel, MemorySpec, Schedule, cost_fields, cost_problem
from pipeforge.semantics import weight_grad_problem

COST_FIELDS = cost_fields()  # F, I, W, B, comm
MEMORY_FIELDS = ("weights",)  # --cost weights=X sets M_W / M_B (MemorySpec.weights), not a duration


def resolve_costs(schedule: Schedule, costs: CostModel | None) -> CostModel:
    """The cost model a simulation uses: the one given, else the schedule's, else unit costs."""
    if costs is not None:
        return costs
    return schedule.costs if schedule.costs is not None else CostModel()


def parse_cost_flag(text: str, base: CostModel | None = None) -> CostModel:
    """``F=1,I=1,W=1,B=2,comm=0.1`` over ``base`` (unit costs if None), field by field.

    Raises ``ArgumentError`` naming the bad item. Every value must be a finite number
    >= 0; compute durations must be > 0 (a zero-length compute makes bounds vacuous).
    """
    model = base if base is not None else CostModel()
    if not text.strip():
        raise ArgumentError(Argument("costs"), "expected NAME=VALUE items like F=1,I=1,W=1,comm=0", value=text)
    changes = cost_items(text)
    durations = {k: v for k, v in changes.items() if k not in MEMORY_FIELDS}
    # cast: each key is one of COST_FIELDS (_parse_cost_item), CostModel's number fields, which a float fits;
    # the checker sees any str key, which could name per_stage, links or overhead
    return replace(model, **cast("dict[str, Any]", durations))


def weights_from_flag(text: str | None) -> float | None:
    """``weights=X`` in a ``--cost`` flag (M_W / M_B, ``semantics.weight_grad_problem``'s rule), or None
    when absent."""
    if text is None:
        return None
    return cost_items(text).get("weights")


def cost_items(text: str) -> dict[str, float]:
    """``{name: value}`` of ``F=1,I=2``; a name given twice is refused with both items (the last one
    silently won; two ``--cost`` flags reach here joined by a comma)."""
    items: dict[str, float] = {}
    first: dict[str, str] = {}
    for item in text.split(","):
        name, value = _parse_cost_item(item)
        if name in first:
            raise _bad_cost_item(item, f"{name} is given twice, first as {first[name]!r}")
        first[name] = item.strip()
        items[name] = value
    return items


def _parse_cost_item(item: str) -> tuple[str, float]:
    name, eq, raw = item.partition("=")
    name = name.strip()
    if not eq or not name:
        raise _bad_cost_item(item, "expected NAME=VALUE, like F=1.5")
    if name not in COST_FIELDS + MEMORY_FIELDS:
        raise _bad_cost_item(item, f"unknown cost {name!r}; expected one of {', '.join(COST_FIELDS + MEMORY_FIELDS)}")
    try:
        if not raw.strip().isascii():  # float() also takes other scripts' digits
            raise ValueError(raw)
        value = float(raw.strip())
    except ValueError:
        raise _bad_cost_item(item, f"{raw.strip()!r} is not a number") from None
    if name in MEMORY_FIELDS:
        problem = weight_grad_problem(value)
        if problem is not None:
            raise _bad_cost_item(item, problem)
        return name, value
    if not value == value or value in (float("inf"), float("-inf")) or value < 0:
        raise _bad_cost_item(item, "a cost must be a finite number >= 0")
    problem = cost_problem(value)
    if problem is not None:
        raise _bad_cost_item(item, problem)
    if name != "comm" and value == 0:
        raise _bad_cost_item(item, "a compute duration must be > 0")
    return name, value


def _bad_cost_item(item: str, problem: str) -> ArgumentError:
    return ArgumentError(Argument("costs", item.strip()), problem, value=item.strip())


def duration_table(costs: CostModel, stages: int) -> dict[tuple[ActionKind, int], float]:
    """``(kind, stage) -> duration`` for every compute kind and stage (lookups in the hot loop)."""
    return {(kind, stage): costs.duration(kind, stage) for kind in COMPUTE_KINDS for stage in range(stages)}


def costs_to_json(costs: CostModel) -> dict[str, object]:
    out = {f.name: getattr(costs, f.name) for f in fields(costs) if f.name not in ("per_stage", "links", "overhead")}
    out["B"] = costs.B if costs.B is not None else costs.I + costs.W
    if costs.overhead.given:
        out["step"] = costs.overhead.step
        out["chain_sum"] = list(costs.overhead.chain_sum)
    if costs.per_stage:
        out["per_stage"] = [list(entry) for entry in costs.per_stage]
    if costs.links:
        out["links"] = list(costs.links)
    return out


def costs_for(schedule: Schedule, flag: str | None) -> CostModel:
    """The schedule's cost model (or unit costs) with a ``--cost`` flag's fields laid over it."""
    base = resolve_costs(schedule, None)
    return parse_cost_flag(flag, base) if flag is not None else base


def memory_for(schedule: Schedule, limit: float | None, cost_flag: str | None = None) -> MemorySpec:
    """The schedule's memory spec (or the default) with ``--memory-limit`` and ``--cost weights=`` laid over it."""
    base = schedule.memory or MemorySpec()
    weights = weights_from_flag(cost_flag)
    if weights is not None:
        base = replace(base, weights=weights)
    if limit is None:
        return base
    if not limit > 0 or limit == float("inf"):
        raise ArgumentError(Argument("memory_limit", value=repr(limit)),
                            "expected a positive number of M_B (one microbatch's activations)", value=limit)
    return replace(base, limit=limit)
