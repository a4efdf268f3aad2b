"""Contiguous blocks of a sequence whose costliest block is cheapest: the partition ``split`` and ``plan`` share.

``least_max_edges(weights, blocks, first, last, at_least)`` is exact dynamic
programming over the cut points (blocks x items x items steps). ``first`` is
added to block 0 and ``last`` to the final block (a model's embedding and its
head); each block holds at least ``at_least`` items. Ties go to earlier cuts.
"""

from __future__ import annotations

from collections.abc import Sequence


def least_max_edges(weights: Sequence[float], blocks: int, first: float = 0.0, last: float = 0.0,
                    at_least: int = 0) -> list[int]:
    """The ``blocks + 1`` edges (0 first, ``len(weights)`` last) of the partition with the cheapest costliest block."""
    count, inf = len(weights), float("inf")
    prefix = [0.0]
    for weight in weights:
        prefix.append(prefix[-1] + weight)
    # best[s][b]: the least max cost of blocks 0..s-1 covering items [0, b); cut[s][b]: where block s-1 starts
    best = [[inf] * (count + 1) for _ in range(blocks + 1)]
    cut = [[0] * (count + 1) for _ in range(blocks + 1)]
    best[0][0] = 0.0
    for s in range(1, blocks + 1):
        extra = (first if s == 1 else 0.0) + (last if s == blocks else 0.0)
        for b in range(s * at_least, count + 1):
            for a in range((s - 1) * at_least, b - at_least + 1):
                value = max(best[s - 1][a], prefix[b] - prefix[a] + extra)
                if value < best[s][b]:
                    best[s][b], cut[s][b] = value, a
    edges = [count]
    for s in range(blocks, 0, -1):
        edges.append(cut[s][edges[-1]])
    edges.reverse()
    return edges
