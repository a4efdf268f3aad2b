"""A lower bound on every schedule of this work that may recompute: the recompute a memory limit forces.

``recompute_span(graph, memory)`` -> ``RecomputeBound``: for a work graph of F and backward (no R,
OFFLOAD or RELOAD; every microbatch of the same kinds, as the split work is: the other arguments read
one microbatch's paths) and a ``MemorySpec`` with a limit and a checkpoint, a proven lower bound on the worst
span of any schedule of that work within the limit in which any (stage, microbatch) may be recomputed
(an R of cost ``R`` before its backward, its F holding only the checkpoint until then); per rank, the
span and the recompute time the limit forces; never below ``work_bound`` at a limit no rank reaches
(what needs no memory argument). Offloading is not covered. Sound, not tight: memory is counted over time, not at peaks.
The argument: ``docs/bounds.md`` (Recompute).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from pipeforge.ir import ActionKind, CostModel, MemorySpec
from pipeforge.semantics import bubble_rate
from pipeforge.sim.bounds.work import WorkBound, busy_per_rank, work_bound
from pipeforge.sim.workgraph import WorkGraph

_F, _B, _I, _R = ActionKind.F, ActionKind.B, ActionKind.I, ActionKind.R


@dataclass(frozen=True)
class RecomputeBound:
    """``max_span``: no schedule of the work that may recompute, within ``memory_limit``, has a shorter
    worst span; ``ranks``: per rank, (the span proved for it, the recompute seconds its limit forces)."""

    max_span: float
    memory_limit: float | None
    ranks: tuple[tuple[float, float], ...] = ()


def recompute_span(graph: WorkGraph, memory: MemorySpec) -> RecomputeBound:
    """The bound of the module doc for ``graph``'s work under ``memory`` (its limit and checkpoints)."""
    # no memory argument: a limit no rank can reach (work_bound's None means the schedule's own peak)
    free = work_bound(graph, float(len(graph.actions)) * max((1.0, *memory.activation))).max_span
    limit = memory.limit
    if limit is None:
        return RecomputeBound(free, None)
    busy = busy_per_rank(graph)
    ranks = tuple(_rank_span(graph, memory, r, busy[r], limit) for r in range(graph.shape.ranks))
    return RecomputeBound(max(free, max((span for span, _ in ranks), default=0.0)), limit, ranks)


def with_forced_recompute(bound: WorkBound, graph: WorkGraph, memory: MemorySpec) -> WorkBound:
    """``bound`` (a ``work_bound`` with no memory limit: its arguments hold whatever is recomputed) with
    each rank's forced-recompute span (``RankSpan.recompute``) and the worst span raised to the largest."""
    found = recompute_span(graph, memory)
    if not found.ranks:
        return bound
    ranks = tuple(replace(r, recompute=found.ranks[r.rank][0]) if r.rank < len(found.ranks) else r
                  for r in bound.ranks)
    span = max(bound.max_span, max((r.span for r in ranks), default=0.0))
    busy = [r.busy for r in ranks]
    return WorkBound(span, bubble_rate(sum(busy) / len(busy) if busy else 0.0, span), memory.limit, ranks,
                     bound.fill)


def _stages(graph: WorkGraph, r: int) -> list[tuple[int, int, int]]:
    """(chain, stage, forwards) of each stage rank r runs F of."""
    counts: dict[tuple[int, int], int] = {}
    for action, rank in zip(graph.actions, graph.rank):
        if rank == r and action.kind is _F:
            counts[(action.chain, action.stage)] = counts.get((action.chain, action.stage), 0) + 1
    return [(chain, stage, n) for (chain, stage), n in sorted(counts.items())]


def round_trip(graph: WorkGraph, chain: int, stage: int) -> float:
    """The least time from the start of F(stage, m) to the end of its backward there (``trip_time``)."""
    return trip_time(graph.costs, graph.shape.placements[chain].stage_to_rank, stage)


def trip_time(costs: CostModel, stage_to_rank, stage: int) -> float:
    """The least time from the start of an F of ``stage`` to the end of its backward there: the forwards
    up to the last stage, the backwards (the cheaper of I and B) down again, each link's latency both
    ways (between stages on different ranks)."""
    last = len(stage_to_rank) - 1
    total = 0.0
    for t in range(stage, last + 1):
        total += costs.duration(_F, t) + min(costs.duration(_I, t), costs.duration(_B, t))
        if t < last and stage_to_rank[t] != stage_to_rank[t + 1]:
            total += costs.latency(t, t + 1) + costs.latency(t + 1, t)
    return total


def _rank_span(graph: WorkGraph, memory: MemorySpec, r: int, busy: float, limit: float) -> tuple[float, float]:
    """Rank r's span bound and forced recompute time. Microbatch k of stage s holds its activation a from
    its F's start to its backward's end (at least the round trip T), or, recomputed, its checkpoint c that
    long and a - c from its R's start (at least R + I before that end); what a rank holds never exceeds the
    limit L, so over the span S the held amount integrates to at most L * S, while S >= busy + the R run.
    Recomputing (s, k) saves g = (a - c)(T - R - I) of that integral for R of time: the least S for which
    the savings needed, max(0, sum a T - L S), can be bought (cheapest per second first) within S - busy."""
    costs = graph.costs
    options, need = [], 0.0  # (seconds per unit saved, units one recompute saves, how many may), integral
    for chain, stage, n in _stages(graph, r):
        a, c = memory.stage_activation(stage), memory.stage_checkpoint(stage)
        trip, rebuild = round_trip(graph, chain, stage), costs.duration(_R, stage)
        back = min(costs.duration(_I, stage), costs.duration(_B, stage))
        need += n * a * trip
        saved = (a - c) * (trip - rebuild - back)
        if saved > 0:
            options.append((rebuild / saved, saved, n))
    options.sort()

    def cost(units: float) -> float | None:
        """The least recompute seconds that save ``units`` (None: recomputing everything saves less)."""
        seconds = 0.0
        for per_unit, saved, n in options:
            take = min(units, saved * n)
            seconds += take * per_unit
            units -= take
            if units <= 1e-12:
                return seconds
        return None if units > 1e-9 else seconds

    def feasible(span: float) -> bool:
        spent = cost(max(0.0, need - limit * span))
        return spent is not None and busy + spent <= span + 1e-9

    low, high = busy, max(busy, need / limit if limit > 0 else busy)
    for _ in range(200):  # (past that nothing fits at all, and any span is a bound)
        if feasible(high):
            break
        high = 2 * high + 1.0
    for _ in range(100):
        middle = (low + high) / 2
        low, high = (low, middle) if feasible(middle) else (middle, high)
        if high - low <= 1e-9 * max(1.0, high):
            break
    forced = cost(max(0.0, need - limit * high)) or 0.0
    return high, forced


__all__ = ["RecomputeBound", "recompute_span", "round_trip", "trip_time", "with_forced_recompute"]
