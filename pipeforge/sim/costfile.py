"""Per-stage cost files (``--costs FILE``): read, check and write.

``read_cost_file(path)`` / ``cost_file_from_json(data)`` -> ``StageCosts`` (per-stage durations, link
latencies, memory in M_B, per-step overhead); ``cost_file_json(...)`` writes what ``pipeforge profile``
measured; ``with_cost_file(schedule, path)`` is the schedule on those costs. Errors name the file and
the JSON path of the bad value (``costs.json: $.stages[2].F: expected a number > 0``) and are
``CostFileError``s, ``UsageError``s (exit 2). The schema: ``docs/language.md`` (cost file).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from pipeforge.errors import UsageError
from pipeforge.files import JsonError, read_json
from pipeforge.ir import ActionKind, CostModel, MemorySpec, Schedule, StepOverhead, cost_problem
from pipeforge.semantics import DURATION_DEFAULTS, compute_kind_names, weight_grad_problem

_DURATIONS = compute_kind_names()  # one duration a compute kind (semantics)
_REQUIRED = tuple(kind for kind in _DURATIONS if ActionKind(kind) not in DURATION_DEFAULTS)  # F, I, W
_STAGE_KEYS = (*_REQUIRED, *(kind for kind in _DURATIONS if kind not in _REQUIRED), "activation", "weight_grad",
               "checkpoint")
_TOP_KEYS = ("units", "stages", "links", "comm", "dispatch", "step", "chain_sum", "host_bandwidth")
_TRANSFERS = ("OFFLOAD", "RELOAD")  # their durations default to activation / host_bandwidth where both are given


@dataclass(frozen=True)
class StageCosts:
    """What a cost file says: durations per stage, memory per stage (M_B = the largest activation), links."""

    costs: CostModel
    activation: tuple[float, ...]  # M_B units, () when the file gives none
    weight_grad: tuple[float, ...]  # M_B units, () when the file gives none
    units: str | None
    activation_bytes: float | None  # what one M_B is, in the file's memory unit
    checkpoint: tuple[float, ...] = ()  # M_B units: what a recomputed forward keeps, () when the file gives none

    @property
    def stages(self) -> int:
        return len({s for s, _, _ in self.costs.per_stage})

    def memory(self, base: MemorySpec) -> MemorySpec:
        """``base`` with this file's per-stage activation and weight-gradient memory."""
        from dataclasses import replace

        activation = self.activation or base.activation
        weight_grad = self.weight_grad or base.weight_grad
        checkpoints = self.checkpoint or base.checkpoints
        return replace(base, activation=activation, weight_grad=weight_grad, checkpoints=checkpoints)


class CostFileError(UsageError):
    """A cost file that cannot be read or says something impossible: the file and JSON path named."""

    def __init__(self, path: str, where: str, problem: str):
        super().__init__(f"{path}: {where}: {problem}" if where else f"{path}: {problem}")
        self.path, self.where, self.problem = path, where, problem


def read_cost_file(path: str | Path) -> StageCosts:
    """The cost file at ``path``, checked (``CostFileError`` naming the file and JSON path)."""
    name = str(path)
    try:
        data = read_json(path, "cost file")  # a UsageError naming the file if unreadable
    except JsonError as err:
        raise CostFileError(name, err.where, err.problem) from None
    return cost_file_from_json(data, name)


def cost_file_from_json(data: object, name: str = "<costs>") -> StageCosts:
    if not isinstance(data, dict):
        raise CostFileError(name, "$", "expected a JSON object with a \"stages\" list")
    for key in data:
        if key not in _TOP_KEYS:
            raise CostFileError(name, f"$.{key}", f"unknown key; expected {', '.join(_TOP_KEYS)}")
    stages = data.get("stages")
    if not isinstance(stages, list) or not stages:
        raise CostFileError(name, "$.stages", "expected a non-empty list, one object per stage")
    entries = [_stage(entry, f"$.stages[{s}]", name) for s, entry in enumerate(stages)]
    comm = _number(data.get("comm", 0.0), "$.comm", name, positive=False)
    links = _links(data.get("links", []), len(stages), name)
    units = data.get("units")
    if units is not None and not isinstance(units, str):
        raise CostFileError(name, "$.units", "expected a string such as \"ms\"")
    dispatch = _number(data.get("dispatch", 0.0), "$.dispatch", name, positive=False)
    bandwidth = data.get("host_bandwidth")
    if bandwidth is not None:
        bandwidth = _number(bandwidth, "$.host_bandwidth", name, positive=True, duration=False)
        if not all("activation" in e for e in entries):
            raise CostFileError(name, "$.host_bandwidth", "needs 'activation' on every stage (a transfer moves it)")
        for entry in entries:  # one microbatch's activations over the host link, each way
            for kind in _TRANSFERS:
                entry.setdefault(kind, entry["activation"] / bandwidth)
    per_stage = tuple((s, kind, entry[kind] + dispatch * (kind not in _TRANSFERS)) for s, entry in enumerate(entries)
                      for kind in _DURATIONS if kind in entry)
    first = entries[0]
    overhead = StepOverhead(_number(data.get("step", 0.0), "$.step", name, positive=False),
                            _chain_sum(data.get("chain_sum", []), len(stages), name))
    costs = CostModel(**{kind: first[kind] + dispatch for kind in _REQUIRED}, comm=comm,
                      per_stage=per_stage, links=links, overhead=overhead)
    activation, weight_grad, unit = _memory(entries, name)
    checkpoint: tuple[float, ...] = ()
    if any("checkpoint" in e for e in entries):
        s = next((i for i, e in enumerate(entries) if "checkpoint" not in e or "activation" not in e), None)
        if s is not None:
            raise CostFileError(name, f"$.stages[{s}]",
                                "'checkpoint' needs 'checkpoint' and 'activation' on every stage")
        bad = next((i for i, e in enumerate(entries) if e["checkpoint"] > e["activation"]), None)
        if bad is not None:
            raise CostFileError(name, f"$.stages[{bad}].checkpoint", "is more than the stage's activation; it is "
                                "what a recomputed forward keeps of it")
        assert unit is not None, "every stage gives its activation (checked above): _memory found a unit"
        checkpoint = tuple(e["checkpoint"] / unit for e in entries)
    return StageCosts(costs, activation, weight_grad, units, unit, checkpoint)


def _stage(entry: object, where: str, name: str) -> dict[str, float]:
    if not isinstance(entry, dict):
        raise CostFileError(name, where, f"expected an object with {', '.join(_REQUIRED)} (and optionally "
                            f"{', '.join(_STAGE_KEYS[len(_REQUIRED):])})")
    for key in entry:
        if key not in _STAGE_KEYS:
            raise CostFileError(name, f"{where}.{key}", f"unknown key; expected {', '.join(_STAGE_KEYS)}")
    for key in _REQUIRED:
        if key not in entry:
            raise CostFileError(name, where, f"missing {key!r}")
    problem = weight_grad_problem(entry["weight_grad"]) if "weight_grad" in entry else None
    if problem is not None:  # above the activation allowed: its I adds the rest (``semantics.memory_effect``)
        raise CostFileError(name, f"{where}.weight_grad", problem)
    return {key: _number(value, f"{where}.{key}", name, positive=key in _DURATIONS, duration=key in _DURATIONS)
            for key, value in entry.items()}


def _number(value: object, where: str, name: str, *, positive: bool, duration: bool = True) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise CostFileError(name, where, f"expected a finite number, got {json.dumps(value)}")
    if value < 0 or (positive and value == 0):
        raise CostFileError(name, where, f"expected a number {'> 0' if positive else '>= 0'}, got {value!r}")
    problem = cost_problem(float(value)) if duration else None
    if problem is not None:
        raise CostFileError(name, where, problem)
    return float(value)


def _links(links: object, stages: int, name: str) -> tuple[float, ...]:
    if not isinstance(links, list):
        raise CostFileError(name, "$.links", "expected a list: links[s] is the latency between stage s and s + 1")
    if len(links) > max(stages - 1, 0):
        raise CostFileError(name, "$.links", f"{len(links)} links, but {stages} stages have {stages - 1}")
    return tuple(_number(value, f"$.links[{i}]", name, positive=False) for i, value in enumerate(links))


def _chain_sum(values: object, stages: int, name: str) -> tuple[float, ...]:
    if not isinstance(values, list) or len(values) > stages:
        raise CostFileError(name, "$.chain_sum", f"expected a list of at most {stages} numbers, one per stage: the "
                            "time to sum the stage's gradients across the two chains of a bidirectional schedule")
    return tuple(_number(value, f"$.chain_sum[{i}]", name, positive=False) for i, value in enumerate(values))


def _memory(entries: list[dict[str, float]], name: str
            ) -> tuple[tuple[float, ...], tuple[float, ...], float | None]:
    given = [("activation" in e) for e in entries]
    if any(given) and not all(given):
        s = given.index(False)
        raise CostFileError(name, f"$.stages[{s}]", "missing 'activation' (other stages give it: give it for all)")
    if not any(given):
        if any("weight_grad" in e for e in entries):
            s = next(i for i, e in enumerate(entries) if "weight_grad" in e)
            raise CostFileError(name, f"$.stages[{s}].weight_grad", "needs 'activation' on every stage")
        return (), (), None
    unit = max(e["activation"] for e in entries)
    if unit == 0:
        raise CostFileError(name, "$.stages", "every stage's activation is 0; leave 'activation' out instead")
    activation = tuple(e["activation"] / unit for e in entries)
    grads = [("weight_grad" in e) for e in entries]
    if any(grads) and not all(grads):
        raise CostFileError(name, f"$.stages[{grads.index(False)}]",
                            "missing 'weight_grad' (other stages give it: give it for all)")
    weight_grad = tuple(e["weight_grad"] / unit for e in entries) if any(grads) else ()
    return activation, weight_grad, unit


def cost_file_json(stage_times: list[dict[str, float]], links: list[float], units: str = "ms",
                   step: float | None = None, chain_sum: list[float] | None = None,
                   dispatch: float | None = None) -> dict[str, object]:
    """A cost file's JSON object from measured values (what ``pipeforge profile`` writes)."""
    data: dict[str, object] = {"units": units, "stages": stage_times, "links": links}
    if dispatch is not None:
        data["dispatch"] = dispatch
    if step is not None:
        data["step"] = step
    if chain_sum is not None:
        data["chain_sum"] = chain_sum
    return data


def with_cost_file(schedule: Schedule, path: str | Path | None) -> Schedule:
    """``schedule`` with the cost file's durations, links and per-stage memory (itself when ``path`` is None)."""
    from dataclasses import replace

    if path is None:
        return schedule
    found = read_cost_file(path)
    stages = len({s for s, _, _ in found.costs.per_stage})
    if stages != schedule.stages:
        raise CostFileError(str(path), "$.stages", f"{stages} stages, but the schedule {schedule.name} has "
                            f"{schedule.stages}")
    memory = found.memory(schedule.memory or MemorySpec())
    return replace(schedule, costs=found.costs, memory=memory)
