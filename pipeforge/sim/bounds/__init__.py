"""Lower bounds, each naming the space of schedules it bounds (both on a given placement and cost model).

1. *Orders of these actions* (``orders.py``: ``compute_bounds`` -> ``Bounds``): only the order of the
   schedule's own compute actions on each rank may change. ``simulate``'s ``lower_bound`` and
   ``bubble_lower_bound``.
2. *Schedules of this work* (``work.py``: ``work_bound`` -> ``WorkBound``): a B may be split into I and W,
   any order within a memory limit. ``optimize``'s ``bound`` and ``simulate``'s ``bounds.work``. Its
   per-rank arguments are in ``work.py`` and ``chunk_chain.py``, the one over all ranks together in
   ``fill_chain.py``; all of them walk the longest paths of ``paths.py``. ``recompute.py``: the same space
   where any (stage, microbatch) may also be recomputed (the recompute a memory limit forces).

Import bounds from here. Why each holds: ``docs/bounds.md``.
"""

from pipeforge.sim.bounds.fill_chain import fill_chain_forwards, fill_chain_span
from pipeforge.sim.bounds.recompute import RecomputeBound, recompute_span, trip_time, with_forced_recompute
from pipeforge.sim.bounds.orders import ORDERS_SPACE, Bounds, RankBound, compute_bounds
from pipeforge.sim.bounds.work import (
    ARGUMENTS, WORK_SPACE, RankSpan, WorkBound, bubble_lower_bound, bubble_of_span, busy_per_rank,
    memory_chain_spans, rank_spans, round_trip_idle, span_lower_bound, tail_work, through_spans, work_bound,
)

__all__ = [
    "ARGUMENTS", "ORDERS_SPACE", "WORK_SPACE", "Bounds", "RankBound", "RankSpan", "WorkBound", "bubble_lower_bound",
    "bubble_of_span", "busy_per_rank", "RecomputeBound", "recompute_span", "compute_bounds", "fill_chain_forwards",
    "fill_chain_span", "memory_chain_spans", "rank_spans", "round_trip_idle", "span_lower_bound", "tail_work",
    "through_spans", "trip_time", "with_forced_recompute", "work_bound",
]
