"""``plan``: the layers of each stage and the schedule together, from per-layer costs.

``plan(layer_costs, ranks, microbatches, schedules=None, memory_limit=None)``
tries each library schedule that accepts ``P = ranks, M = microbatches`` (or
those named), and for each one the layer maps reachable from the even split and
from the split whose costliest stage (F + I + W) is cheapest by moving one
boundary one layer at a time while the simulated step gets shorter. Stage
costs are the sums of their layers' (plus ``first`` on stage 0, ``last`` on the
last stage). Returns the ``Plan`` with the shortest simulated step within the
memory limit, with the even split's step on the same schedule and the
schedule's lower bound. Pure: no torch; the layer cost file's schema is
``docs/models.md`` (A plan from costs).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from pipeforge.errors import PipeforgeError, UsageError
from pipeforge.files import JsonError, read_json
from pipeforge.ir import MemorySpec
from pipeforge.library import load_library_schedule, names
from pipeforge.partition import least_max_edges
from pipeforge.semantics import weight_grad_problem
from pipeforge.sim import simulate
from pipeforge.sim.costfile import cost_file_from_json

_KINDS = ("F", "I", "W")


@dataclass(frozen=True)
class LayerCosts:
    layers: tuple[dict[str, float], ...]
    first: dict[str, float]
    last: dict[str, float]
    links: float
    units: str | None


@dataclass(frozen=True)
class Plan:
    schedule: str  # the library name
    defines: dict[str, int]
    layers: tuple[int, ...]  # per stage
    step: float  # simulated step time of this layout
    even_step: float  # the even split's, same schedule
    even_layers: tuple[int, ...]
    lower_bound: float
    peak_memory: tuple[float, ...]
    units: str | None

    def to_json(self) -> dict:
        return {"schedule": self.schedule, "defines": self.defines, "layers": list(self.layers),
                "predicted_step": self.step, "even_layers": list(self.even_layers), "even_split_step": self.even_step,
                "lower_bound": self.lower_bound, "peak_memory": list(self.peak_memory), "units": self.units}


def read_layer_costs(path: str | Path) -> LayerCosts:
    name = str(path)
    try:
        data = read_json(path, "cost file")  # a regular file of at most 4 MiB, JSON within bounds
    except JsonError as error:
        raise UsageError(f"{name}: cannot read a layer cost file: {error.where}: {error.problem}") from None
    return layer_costs_from_json(data, name)


def layer_costs_from_json(data, name: str = "<layer costs>") -> LayerCosts:
    if not isinstance(data, dict) or not isinstance(data.get("layers"), list) or not data["layers"]:
        raise UsageError(f"{name}: $.layers: expected a non-empty list, one object per layer")
    layers = tuple(_entry(entry, f"$.layers[{i}]", name, positive=True) for i, entry in enumerate(data["layers"]))
    first = _entry(data.get("first", {}), "$.first", name, positive=False)
    last = _entry(data.get("last", {}), "$.last", name, positive=False)
    links = data.get("links", 0.0)
    if not isinstance(links, (int, float)) or isinstance(links, bool) or links < 0:
        raise UsageError(f"{name}: $.links: expected a number >= 0 (the latency of one transfer)")
    return LayerCosts(layers, first, last, float(links), data.get("units"))


def _entry(entry, where: str, name: str, positive: bool) -> dict[str, float]:
    if not isinstance(entry, dict):
        raise UsageError(f"{name}: {where}: expected an object with F, I, W (and activation, weight_grad)")
    found = {}
    for key, value in entry.items():
        if key not in (*_KINDS, "activation", "weight_grad", "parameters"):
            raise UsageError(f"{name}: {where}.{key}: unknown key; expected F, I, W, activation, weight_grad, "
                             "parameters")
        problem = weight_grad_problem(value) if key == "weight_grad" else None
        if problem is not None:  # above the activation allowed: its I adds the rest (``semantics.memory_effect``)
            raise UsageError(f"{name}: {where}.{key}: {problem}")
        if not isinstance(value, (int, float)) or isinstance(value, bool) or value < 0:
            raise UsageError(f"{name}: {where}.{key}: expected a number >= 0")
        found[key] = float(value)
    missing = [k for k in _KINDS if k not in found] if positive else []
    if missing or (positive and not all(found[k] > 0 for k in _KINDS)):
        raise UsageError(f"{name}: {where}: F, I and W must be given, each > 0")
    return found


def stage_costs(costs: LayerCosts, layers: tuple[int, ...]) -> dict:
    """The per-stage cost file (``pipeforge.sim.costfile``'s schema) of a layer map."""
    stages, start = [], 0
    for s, count in enumerate(layers):
        parts = [*costs.layers[start: start + count], *([costs.first] if s == 0 else []),
                 *([costs.last] if s == len(layers) - 1 else [])]
        entry = {k: sum(p.get(k, 0.0) for p in parts) for k in _KINDS}
        if any("activation" in p for p in costs.layers):
            entry["activation"] = max(sum(p.get("activation", 0.0) for p in parts), 1e-9)
            if any("weight_grad" in p for p in costs.layers):
                entry["weight_grad"] = sum(p.get("weight_grad", 0.0) for p in parts)
        stages.append(entry)
        start += count
    return {"units": costs.units or "ms", "stages": stages, "links": [costs.links] * (len(layers) - 1),
            "comm": costs.links}


def even(count: int, stages: int) -> tuple[int, ...]:
    edges = [round(s * count / stages) for s in range(stages + 1)]
    return tuple(edges[s + 1] - edges[s] for s in range(stages))


def least_costliest(costs: LayerCosts, stages: int) -> tuple[int, ...]:
    """Contiguous layers, one or more a stage, whose costliest stage (F + I + W) is cheapest (exact DP)."""
    weights = [sum(layer[k] for k in _KINDS) for layer in costs.layers]
    first, last = (sum(end.get(k, 0.0) for k in _KINDS) for end in (costs.first, costs.last))
    edges = least_max_edges(weights, stages, first, last, at_least=1)
    return tuple(edges[s + 1] - edges[s] for s in range(stages))


def plan(costs: LayerCosts, ranks: int, microbatches: int, schedules: list[str] | None = None,
         memory_limit: float | None = None, max_moves: int = 200) -> Plan:
    found: list[Plan] = []
    refused: list[str] = []
    for name in schedules or names():
        defines = {"P": ranks, "M": microbatches}
        try:
            schedule = load_library_schedule(name, defines)
        except PipeforgeError as error:
            if schedules:
                raise
            refused.append(f"{name}: {error}")
            continue
        if schedule.stages > len(costs.layers):
            refused.append(f"{name}: {schedule.stages} stages for {len(costs.layers)} layers")
            continue
        result = _best_layout(costs, schedule, name, defines, memory_limit, max_moves)
        if result is not None:
            found.append(result)
    if not found:
        raise UsageError(f"plan: no schedule fits ({'; '.join(refused) or 'none within the memory limit'})")
    return min(found, key=lambda p: (p.step, p.schedule))


def _best_layout(costs, schedule, name, defines, memory_limit, max_moves) -> Plan | None:
    def simulated(layers):
        if layers not in seen:
            seen[layers] = _simulate(costs, schedule, layers, memory_limit)
        return seen[layers]

    seen: dict[tuple[int, ...], object] = {}
    even_layers = even(len(costs.layers), schedule.stages)
    best = None
    for start in (even_layers, least_costliest(costs, schedule.stages)):
        layers = _descend(start, simulated, max_moves)
        timeline = simulated(layers)
        if timeline is not None and (best is None or timeline.step_time < best[1].step_time):
            best = (layers, timeline)
    if best is None:
        return None
    layers, timeline = best
    even_timeline = simulated(even_layers)
    even_step = even_timeline.step_time if even_timeline is not None else float("inf")
    return Plan(name, defines, layers, timeline.step_time, even_step, even_layers, timeline.lower_bound,
                timeline.peak_memory, costs.units)


def _descend(layers: tuple[int, ...], simulated, max_moves: int) -> tuple[int, ...]:
    """Move one boundary by one layer while the simulated step gets shorter (first improvement)."""
    current = simulated(layers)
    for _ in range(max_moves):
        improved = False
        for neighbour in _neighbours(layers):
            timeline = simulated(neighbour)
            if timeline is not None and (current is None or timeline.step_time < current.step_time - 1e-12):
                layers, current, improved = neighbour, timeline, True
                break
        if not improved:
            break
    return layers


def _neighbours(layers: tuple[int, ...]):
    for s in range(len(layers) - 1):
        for give, take in ((s, s + 1), (s + 1, s)):
            if layers[give] > 1:
                moved = list(layers)
                moved[give] -= 1
                moved[take] += 1
                yield tuple(moved)


def _simulate(costs, schedule, layers, memory_limit):
    found = cost_file_from_json(stage_costs(costs, layers))
    memory = found.memory(replace(schedule.memory or MemorySpec(), limit=memory_limit)
                          if memory_limit is not None else schedule.memory or MemorySpec())
    timeline = simulate(replace(schedule, costs=found.costs, memory=memory))
    if timeline.within_memory_limit is False:
        return None
    return timeline
