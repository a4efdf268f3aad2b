"""What ``optimize`` returns: the result, the figures before and after, the bound, and why it stopped.

Two bubble rates, because a schedule that splits B into I and W does more
compute than one that fuses it when I + W > B (measured costs often have
that): ``bubble_rate`` is what ``simulate`` reports for each schedule (its
own compute: I + W where B is split), and ``least_work_bubble_rate`` counts
the same least work for every schedule and for the bound (``LEAST_WORK``:
``sim.bounds.bubble_of_span``). The bound is a bound on the worst span (the
step time); on the least work the bubble rate is a function of that span
alone, so "after" is never below the bound there. With the default B = I + W
the two rates are equal.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from pipeforge.ir import CostModel, MemorySpec, Schedule
from pipeforge.optimizer.evaluate import Evaluation
from pipeforge.sim import simulate
from pipeforge.sim.bounds import WorkBound

LEAST_WORK = ("each rank's least compute, averaged over the ranks: F and the cheaper of B or I + W for each "
              "microbatch (what the bound counts), the same for every schedule of the work")

STOP_REASONS = {
    "bound": "the best order reaches the proven lower bound: it is optimal",
    "stalled": "the search stopped improving before the time limit",
    "time": "the time limit ran out",
    "finished": "every setting of the strategy ran",
}


# Where some stage's B costs less than its I + W, which pass chose per (stage, microbatch) whether a B stays
# whole (``optimizer/fuse.py``), per strategy; with B = I + W everywhere none runs and none is reported.
FUSE_PASSES = {
    "search": "the fuse search, local search between its descents, kept each B whole or split it per "
              "(stage, microbatch)",
    "greedy": "the greedy orders are of the split work (every B as I and W); fuse descents from the best of "
              "them then kept each B whole or split it per (stage, microbatch), within the time limit",
    "exact": "exact search orders the split work only (every B as I and W): its proven bound (split_bound) holds "
             "for those orders, not for orders that keep some B whole; fuse descents from its best then kept each "
             "B whole or split it per (stage, microbatch), within the time limit",
}


@dataclass(frozen=True)
class Metrics:
    bubble_rate: float
    makespan: float
    peak_memory: tuple[float, ...]
    max_span: float
    spans: tuple[float, ...] = ()
    least_work_bubble_rate: float | None = None  # 1 - the least work / max_span (LEAST_WORK); None: not known

    def with_least_work(self, bubble_of_span) -> Metrics:
        """The same figures with ``least_work_bubble_rate`` set from ``bubble_of_span(max_span)``."""
        return replace(self, least_work_bubble_rate=bubble_of_span(self.max_span))

    @staticmethod
    def of(evaluation: Evaluation) -> Metrics:
        return Metrics(evaluation.bubble_rate, evaluation.makespan, evaluation.peak_memory,
                       evaluation.max_span, evaluation.spans)

    def key(self) -> tuple[float, float, float]:
        """Worst span, total span, makespan: ``Evaluation.key`` without its tie-breaker."""
        return (round(self.max_span, 9), round(sum(self.spans), 9), round(self.makespan, 9))

    def scaled(self, factor: float) -> Metrics:
        """The same figures with every time multiplied by ``factor`` (integer units to the input's)."""
        return replace(self, makespan=self.makespan * factor, max_span=self.max_span * factor,
                       spans=tuple(span * factor for span in self.spans))

    def to_json(self) -> dict:
        return {"bubble_rate": self.bubble_rate, "least_work_bubble_rate": self.least_work_bubble_rate,
                "makespan": self.makespan, "peak_memory": list(self.peak_memory), "max_span": self.max_span}


@dataclass(frozen=True)
class OptimizeResult:
    """The optimized schedule (compute only), the figures before and after, the bound and the gap.

    ``span_bound`` is a proven lower bound on the worst span of any order of
    the same work within the memory limit (B split into I and W allowed), and
    ``bound`` the bubble rate it implies on the least work (``LEAST_WORK``; the
    ``least_work_bubble_rate`` of before and after count the same work);
    ``gap`` is ``(after span - span_bound) / after span`` (0: optimal).
    """

    schedule: Schedule
    before: Metrics
    after: Metrics
    bound: float
    span_bound: float
    gap: float
    optimal: bool
    improved: bool
    found_by: str
    strategy: str
    seconds: float
    memory_limit: float | None = None
    stopped: str = "finished"
    placement: str = "keep (the input's)"
    placements_tried: tuple[str, ...] = ("keep (the input's)",)
    work_bound: WorkBound | None = None  # the bound in the input's placement before any search
    fuse: str | None = None  # which pass kept B whole or split it (FUSE_PASSES); None: no stage has B < I + W
    split_bound: float | None = None  # exact search's bound on orders of the split work only (fuse "exact")

    @property
    def bound_of(self) -> str:
        """What the bound bounds: every order of the work in each placement tried."""
        return f"any order of the same work (each B fused or split into I and W) within the memory limit, placed " \
               f"{' or '.join(self.placements_tried)}"

    def to_json(self) -> dict:
        return {
            "schedule": self.schedule.name, "strategy": self.strategy, "found_by": self.found_by,
            "stopped": self.stopped, "stopped_because": STOP_REASONS[self.stopped],
            "improved": self.improved, "optimal": self.optimal, "memory_limit": self.memory_limit,
            "placement": {"chosen": self.placement, "tried": list(self.placements_tried),
                          "stages": self.schedule.stages, "ranks": self.schedule.ranks},
            "before": self.before.to_json(), "after": self.after.to_json(),
            "bound": {"bubble_rate": self.bound, "least_work_bubble_rate": self.bound, "max_span": self.span_bound,
                      "of": self.bound_of, "static": None if self.work_bound is None else self.work_bound.to_json()},
            "least_work": LEAST_WORK, "gap": self.gap, "seconds": self.seconds,
            "fuse": None if self.fuse is None else {"pass": self.fuse, "means": FUSE_PASSES[self.fuse],
                                                    "split_bound": self.split_bound},
        }


def metrics_of(schedule: Schedule, costs: CostModel, memory: MemorySpec) -> Metrics:
    """The figures ``pipeforge.sim`` reports for ``schedule``."""
    timeline = simulate(schedule, costs, memory=memory)
    spans = tuple(s.span for s in timeline.rank_stats)
    return Metrics(timeline.bubble_rate, timeline.makespan, timeline.peak_memory, max(spans, default=0.0), spans)
