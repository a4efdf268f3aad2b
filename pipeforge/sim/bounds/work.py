"""Lower bounds on every schedule of this work (space 2 of ``pipeforge.sim.bounds``), whatever its order.

Every (stage, microbatch) runs its forward and its backward, a backward possibly split into I and W,
within a memory limit, on any placement. ``work_bound(graph, limit)`` -> ``WorkBound``: per rank a
``RankSpan`` holding the five arguments (``busy``, ``round trip``, ``through rank q``, ``memory chain``,
``chunk chain``: ``chunk_chain.py``) and naming the one that binds, and the ``fill chain`` over all
ranks (``fill_chain.py``); the worst span and bubble rate none of those schedules can beat. This is
``optimize``'s ``bound`` and ``simulate``'s ``bounds.work``. The statements are in
``docs/optimize.md`` (Bounds), the proofs in ``docs/bounds.md``. Import from ``pipeforge.sim.bounds``.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass

from pipeforge.ir import ActionKind
from pipeforge.semantics import bubble_rate
from pipeforge.sim.bounds.chunk_chain import chunk_chain_spans
from pipeforge.sim.bounds.fill_chain import fill_chain_span, least_stage_work
from pipeforge.sim.bounds.paths import Paths
from pipeforge.sim.workgraph import WorkGraph

_F, _B, _I, _W = ActionKind.F, ActionKind.B, ActionKind.I, ActionKind.W
WORK_SPACE = "any schedule of this work (B may be split into I and W)"

# --- space 2: every schedule of the work --------------------------------------------------

TOLERANCE = 1e-9
ARGUMENTS = {
    "busy": "the rank's own compute",
    "round trip": "the rank's compute plus the idle its round trips force within the memory limit",
    "through": "the work of another rank that lies between two of this rank's actions, run one at a time",
    "memory chain": "the rank's forwards, at most floor(limit) of them in flight, each held a round trip",
    "chunk chain": "the memory chain of a rank holding several stages, each microbatch holding all of them a while",
    "forced recompute": "where any (stage, microbatch) may be recomputed: the rank's compute plus the recompute its "
                        "limit forces, memory held over time within the limit (recompute.py)",
    "fill chain": "over all ranks: the idle the pipeline's fill forces before each rank's first backward, "
                  "shared out among the ranks as well as any schedule can (fill_chain.py)",
}


@dataclass(frozen=True)
class RankSpan:
    """What is proved of rank ``rank``'s span in every schedule of the work: at least ``busy``,
    ``round_trip`` (busy plus the idle its round trips force within the limit), ``through``
    (the one-machine bound through rank ``through_rank``), ``chain`` (the memory chain) and
    ``chunks`` (the chunk chain); ``span`` is the largest."""

    rank: int
    busy: float
    round_trip: float
    through: float = 0.0
    through_rank: int | None = None
    chain: float = 0.0
    chunks: float = 0.0
    recompute: float = 0.0  # the forced recompute's (recompute.py), where the schedules may recompute

    @property
    def span(self) -> float:
        return max(self.busy, self.round_trip, self.through, self.chain, self.chunks, self.recompute)

    @property
    def argument(self) -> str:
        """``busy``, ``round trip``, ``through rank q``, ``memory chain``, ``chunk chain`` or ``forced
        recompute``: the argument that gives ``span``."""
        if self.recompute > max(self.busy, self.round_trip, self.through, self.chain, self.chunks) + TOLERANCE:
            return "forced recompute"
        if self.chunks > max(self.busy, self.round_trip, self.through, self.chain) + TOLERANCE:
            return "chunk chain"
        if self.chain > max(self.busy, self.round_trip, self.through) + TOLERANCE:
            return "memory chain"
        if self.through > max(self.busy, self.round_trip) + TOLERANCE:
            return f"through rank {self.through_rank}"
        return "round trip" if self.round_trip > self.busy + TOLERANCE else "busy"

    def to_json(self) -> dict:
        return {"rank": self.rank, "span": self.span, "argument": self.argument, "busy": self.busy,
                "round_trip": self.round_trip, "through": self.through, "through_rank": self.through_rank,
                "memory_chain": self.chain, "chunk_chain": self.chunks, "forced_recompute": self.recompute}


@dataclass(frozen=True)
class WorkBound:
    """A proven lower bound on the worst span, and so on the bubble rate, of every schedule of the work
    (``WORK_SPACE``) holding at most ``memory_limit`` M_B a rank (None: no limit); ``ranks``: what is
    proved of each rank's span, and by which argument (``ARGUMENTS``)."""

    max_span: float
    bubble_rate: float
    memory_limit: float | None
    ranks: tuple[RankSpan, ...] = ()
    fill: float = 0.0  # the fill chain's bound on the worst span (no one rank's: fill_chain.py)

    def scaled(self, factor: float) -> WorkBound:
        """The same bound with every time multiplied by ``factor``."""
        ranks = tuple(RankSpan(r.rank, r.busy * factor, r.round_trip * factor, r.through * factor, r.through_rank,
                               r.chain * factor, r.chunks * factor, r.recompute * factor) for r in self.ranks)
        return WorkBound(self.max_span * factor, self.bubble_rate, self.memory_limit, ranks, self.fill * factor)

    @property
    def binding(self) -> RankSpan | None:
        """The rank whose bound is the bound (the first of the largest); None where no rank's is (the
        fill chain binds: ``argument``)."""
        if self.fill > max((r.span for r in self.ranks), default=0.0) + TOLERANCE:
            return None
        return max(self.ranks, key=lambda r: r.span - r.rank * TOLERANCE, default=None)

    @property
    def argument(self) -> str | None:
        """The argument that gives the bound (``ARGUMENTS``: the binding rank's, or ``fill chain``)."""
        binding = self.binding
        if binding is not None:
            return binding.argument
        return "fill chain" if self.ranks else None

    @property
    def binding_text(self) -> str:
        """Whose bound it is and by which argument, as the commands print it ("" where nothing is said)."""
        if self.argument is None:
            return ""
        return f"{'all ranks' if self.binding is None else f'rank {self.binding.rank}'}: {self.argument}"

    def to_json(self) -> dict:
        binding = self.binding
        return {"space": WORK_SPACE, "max_span": self.max_span, "bubble_rate": self.bubble_rate,
                "memory_limit": self.memory_limit,
                "rank": None if binding is None else binding.rank, "argument": self.argument,
                "fill_chain": self.fill, "arguments": ARGUMENTS, "ranks": [r.to_json() for r in self.ranks]}


def work_bound(graph: WorkGraph, limit: float | None) -> WorkBound:
    """The bound on space 2 for ``graph``'s work (fused or split, the same work) within ``limit``."""
    ranks = rank_spans(graph, limit)
    busy = [r.busy for r in ranks]  # (busy_per_rank's, as rank_spans read it)
    fill = fill_chain_span(graph, limit, busy)
    span = max(max((r.span for r in ranks), default=0.0), fill)
    return WorkBound(span, _bubble(busy, span), limit, ranks, fill)


def busy_per_rank(graph: WorkGraph) -> list[float]:
    """Each rank's least compute time: F and the cheaper of B or I + W, for each forward it runs."""
    cost, stages = graph.costs.duration, graph.shape.stages
    per_stage = [least_stage_work(graph.costs, s) for s in range(stages)]
    busy = [0.0] * graph.shape.ranks
    forwards = Counter((rank, action.stage) for action, rank in zip(graph.actions, graph.rank) if action.kind is _F)
    for (rank, stage), n in forwards.items():
        busy[rank] += n * (per_stage[stage] if stage < stages else cost(_F, stage))
    return busy


@dataclass(frozen=True)
class _RankShape:
    """What the round-trip bound needs of one rank (read from one microbatch: costs do not depend on it)."""

    trip_to_i: float      # from the start of the rank's first F to the earliest start of any of its I
    least_lag: float      # the least wait, over its stages, from the end of an F to the start of its I
    forwards: int         # how many F the rank runs in all
    longest_f: float
    longest_iw: float     # the longest I + W among its stages
    longest_w: float


def _rank_shape(graph: WorkGraph, paths: Paths, r: int) -> _RankShape | None:
    """Rank r's round trips (None when it runs no F or no I of the microbatch); a trip is timed with
    each action's least duration (``least_durations``: a fused B may be cheaper than its I)."""
    actions, duration = graph.actions, graph.duration
    least = paths.least
    mine = {k: [a for a in paths.members if graph.rank[a] == r and actions[a].kind is k] for k in (_F, _I, _W)}
    if not mine[_F] or not mine[_I]:
        return None
    lane = {(actions[a].chain, actions[a].stage, actions[a].kind): a for k in (_F, _I, _W) for a in mine[k]}
    # The rank's first action is an F of the lowest stage it holds in some chain (everything else on it
    # needs one); an I not after it may start as early as it.
    firsts: dict[int, int] = {}
    for a in mine[_F]:
        if actions[a].stage < actions[firsts.get(actions[a].chain, a)].stage or actions[a].chain not in firsts:
            firsts[actions[a].chain] = a
    trips = []
    for first in firsts.values():
        from_first = paths.from_start_of(first, least)
        trips.append(min(from_first.get(a, 0.0) for a in mine[_I]))
    lags, iw, w = [], [], []
    for f in mine[_F]:
        c, stage = actions[f].chain, actions[f].stage
        i, wa = lane.get((c, stage, _I)), lane.get((c, stage, _W))
        if i is not None:
            lags.append(paths.from_start_of(f, least)[i] - least[f])
            iw.append(duration[i] + (duration[wa] if wa is not None else 0.0))
        w.append(duration[wa] if wa is not None else 0.0)
    if not trips or not lags:
        return None
    return _RankShape(min(trips), min(lags), paths.forwards[r], max(duration[a] for a in mine[_F]), max(iw), max(w))


def tail_work(shape: _RankShape, limit: float, weights: float) -> float:
    """The most I/W work a rank can hold ready for after its last F (memory-capped)."""
    best = 0.0
    for k in range(1, min(shape.forwards, math.floor(limit + TOLERANCE)) + 1):
        room = limit - k
        j = shape.forwards - k if weights <= 0 else min(shape.forwards - k, math.floor(room / weights + TOLERANCE))
        best = max(best, (k - 1) * shape.longest_iw + j * shape.longest_w)
    return best


def round_trip_idle(graph: WorkGraph, r: int, limit: float | None, paths: Paths | None = None) -> float:
    """Idle time rank r cannot avoid inside its span (0 when nothing can be said)."""
    shape = _rank_shape(graph, paths or Paths(graph), r)
    if shape is None:
        return 0.0
    stages = graph.shape.stages
    count = graph.memory.count_limit(limit, stages) if limit is not None else None
    bound = float(shape.forwards) if count is None else count
    first_burst = min(shape.forwards, math.floor(bound + TOLERANCE))
    head = max(0.0, shape.trip_to_i - first_burst * shape.longest_f)
    tail = max(0.0, shape.least_lag - tail_work(shape, bound, graph.memory.least_weights(stages)))
    if first_burst < shape.forwards:
        return head + tail
    return max(head, tail)


def through_spans(graph: WorkGraph, paths: Paths | None = None) -> list[tuple[float, int | None]]:
    """Per rank r, the one-machine bound through another rank q, and q (``(0, None)`` when nothing is said).

    Every action j of q that comes after some action of r and before some
    action of r (in its microbatch's dependencies) starts at least ``head_j``
    after r's first action starts and ends at least ``tail_j`` before r's last
    action ends (``Paths.heads``, ``tails``); q runs one action at a time. So
    for any thresholds H, T, r's span is at least H + T plus the work of q's
    actions with head >= H and tail >= T (the preemptive one-machine bound with
    release and delivery times, Jackson's). Through the last rank this is the
    pipeline's fill, every microbatch's F and I there, and the drain.

    A B may be fused or split: an I counts the cheaper of I and B, a W what a B
    costs beyond that (at most W). Said only when every microbatch of a chain
    runs the same actions (what the heads and tails, read from one, assume).
    """
    ranks = graph.shape.ranks
    lanes = _lane_counts(graph)
    if lanes is None:
        return [(0.0, None)] * ranks
    paths = paths or Paths(graph)
    duration = paths.least
    found: list[tuple[float, int | None]] = []
    for r in range(ranks):
        heads, tails = paths.heads(r, duration), paths.tails(r, duration)
        jobs: dict[int, list[tuple[float, float, float]]] = {}
        for a in paths.members:
            if a in heads and a in tails:
                action = graph.actions[a]
                work = duration[a] * lanes[(action.chain, action.stage, action.kind)]
                jobs.setdefault(graph.rank[a], []).append((heads[a], tails[a], work))
        found.append(max(((_one_machine(q_jobs), q) for q, q_jobs in jobs.items()), default=(0.0, None)))
    return found


def _one_machine(jobs: list[tuple[float, float, float]]) -> float:
    """max over H, T of H + (work of the jobs with head >= H and tail >= T, when there are any) + T."""
    best = 0.0
    for h, _, _ in jobs:
        for _, t, _ in jobs:
            chosen = [w for hj, tj, w in jobs if hj >= h - TOLERANCE and tj >= t - TOLERANCE]
            if chosen:  # (an empty choice says nothing)
                best = max(best, h + sum(chosen) + t)
    return best


def _lane_counts(graph: WorkGraph) -> dict[tuple, int] | None:
    """How many actions each (chain, stage, kind) runs, when every microbatch of a chain runs each of
    them (else None); None too for fused work (its I and W are one action)."""
    if not graph.actions:
        return None
    stages, kinds, microbatches, chains = zip(*graph.actions)
    if _B in set(kinds) or None in set(microbatches):
        return None
    count = Counter(zip(chains, stages, kinds))
    per_chain = Counter(chain for chain, _ in set(zip(chains, microbatches)))
    if any(n != per_chain[key[0]] for key, n in count.items()):
        return None
    return count


def memory_chain_spans(graph: WorkGraph, limit: float | None, paths: Paths | None = None) -> list[float]:
    """Per rank, the memory chain bound on its span (0 where nothing is said: no limit, several chains,
    a rank without F and I of its lowest stage)."""
    ranks = graph.shape.ranks
    count = graph.memory.count_limit(limit, graph.shape.stages) if limit is not None else None
    if count is None or math.isinf(count) or len(graph.shape.placements) != 1 or not graph.actions:
        return [0.0] * ranks
    in_flight = math.floor(count + TOLERANCE)
    if in_flight < 1:
        return [0.0] * ranks  # no F fits: no schedule runs, nothing to bound
    paths = paths or Paths(graph)
    duration = paths.least
    lanes = Counter((r, a.stage) for a, r in zip(graph.actions, graph.rank) if a.kind is _F)
    return [_memory_chain(graph, paths, duration, r, in_flight, lanes) for r in range(ranks)]


def _memory_chain(graph: WorkGraph, paths: Paths, duration: dict[int, float], r: int, in_flight: int,
                  lanes: Counter) -> float:
    """Rank r's memory chain (``memory chain`` in the module's docstring)."""
    actions = graph.actions
    mine = {(actions[a].stage, actions[a].kind): a for a in paths.members if graph.rank[a] == r}
    forwards = [stage for stage, kind in mine if kind is _F]
    if not forwards:
        return 0.0
    stage = min(forwards)
    f, i, w = mine[(stage, _F)], mine.get((stage, _I)), mine.get((stage, _W))
    if i is None:
        return 0.0
    trip = paths.from_start_of(f, duration)[i] + duration[i]  # F(s) start to I(s) end
    starts: list[float] = []
    for k in range(lanes[(r, stage)]):
        start = starts[-1] + duration[f] if starts else 0.0
        if k >= in_flight:
            start = max(start, starts[k - in_flight] + trip)
        starts.append(start)
    return starts[-1] + trip + (duration[w] if w is not None else 0.0)


def rank_spans(graph: WorkGraph, limit: float | None) -> tuple[RankSpan, ...]:
    """What is proved of each rank's span in any schedule of ``graph``'s work within ``limit``."""
    busy, paths = busy_per_rank(graph), Paths(graph)
    through = through_spans(graph, paths)
    chain, chunks = memory_chain_spans(graph, limit, paths), chunk_chain_spans(graph, limit, paths)
    return tuple(RankSpan(r, busy[r], busy[r] + round_trip_idle(graph, r, limit, paths), *through[r], chain[r],
                          chunks[r]) for r in range(graph.shape.ranks))


def span_lower_bound(graph: WorkGraph, limit: float | None) -> float:
    """A proven lower bound on the worst span of any schedule of ``graph``'s work within ``limit``."""
    return work_bound(graph, limit).max_span


def bubble_of_span(graph: WorkGraph, span: float) -> float:
    """The bubble rate a worst span of ``span`` gives (busy time does not depend on the order)."""
    return _bubble(busy_per_rank(graph), span)


def _bubble(busy: list[float], span: float) -> float:
    """The bubble rate of ranks busy ``busy`` within a worst span of ``span``."""
    return bubble_rate(sum(busy) / len(busy) if busy else 0.0, span)


def bubble_lower_bound(graph: WorkGraph, limit: float | None) -> float:
    return bubble_of_span(graph, span_lower_bound(graph, limit))
