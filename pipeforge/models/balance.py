"""Contiguous layers per stage from per-layer costs: the split whose costliest stage is cheapest.

``costs`` is one number per layer, or ``{"layers": [...], "first": x, "last":
y}`` where ``first`` and ``last`` are what stage 0 (the embedding) and the last
stage (the norm and the head) add. The partition is ``pipeforge.partition``'s,
which ``plan`` uses too (here a stage may hold no layer).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from pipeforge.errors import UsageError
from pipeforge.partition import least_max_edges


def balanced_bounds(costs, count: int, stages: int) -> list[range]:
    layer_costs, first, last = _read(costs, count)
    edges = least_max_edges(layer_costs, stages, first, last)
    return [range(edges[s], edges[s + 1]) for s in range(stages)]


def _read(costs, count: int) -> tuple[list[float], float, float]:
    if isinstance(costs, Mapping):
        layers, first, last = costs.get("layers"), costs.get("first", 0.0), costs.get("last", 0.0)
    else:
        layers, first, last = costs, 0.0, 0.0
    if not isinstance(layers, Sequence) or len(layers) != count or not all(
            isinstance(c, (int, float)) and c >= 0 for c in [*layers, first, last]):
        raise UsageError(f"pipeforge.split: costs must give {count} non-negative numbers, one per layer "
                         f"(or {{'layers': [...], 'first': x, 'last': y}}); got {costs!r}")
    return [float(c) for c in layers], float(first), float(last)
