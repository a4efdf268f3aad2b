"""Contiguous layers per stage from per-layer costs: the split whose costliest stage is cheapest.

``costs`` is one number per layer, or ``{"layers": [...], "first": x, "last":
y}`` where ``first`` and ``last`` are what stage 0 (the embedding) and the last
stage (the norm and the head) add. Exact dynamic programming over the cut
points (layers x stages x layers steps); ties broken toward earlier cuts.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from pipeforge.errors import UsageError


def balanced_bounds(costs, count: int, stages: int) -> list[range]:
    layer_costs, first, last = _read(costs, count)
    prefix = [0.0]
    for cost in layer_costs:
        prefix.append(prefix[-1] + cost)

    def stage_cost(s: int, a: int, b: int) -> float:
        return prefix[b] - prefix[a] + (first if s == 0 else 0.0) + (last if s == stages - 1 else 0.0)

    # best[s][b]: the least max cost of stages 0..s-1 covering layers [0, b)
    inf = float("inf")
    best = [[inf] * (count + 1) for _ in range(stages + 1)]
    cut = [[0] * (count + 1) for _ in range(stages + 1)]
    best[0][0] = 0.0
    for s in range(1, stages + 1):
        for b in range(count + 1):
            for a in range(b + 1):
                value = max(best[s - 1][a], stage_cost(s - 1, a, b))
                if value < best[s][b]:
                    best[s][b], cut[s][b] = value, a
    edges = [count]
    for s in range(stages, 0, -1):
        edges.append(cut[s][edges[-1]])
    edges.reverse()
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
