"""``optimize``: run the strategies, keep the best order, verify it, report before and after.

``optimize(schedule, costs=..., memory_limit=..., strategy="auto"|"greedy"|"local"|"exact",
placement="keep"|..., time_limit=...)`` -> ``OptimizeResult``: a schedule of the same work with the
least worst span found (then total span, then makespan), within the memory limit (``memory_limit``,
else the schedule's own, else the input's peak), verified by ``pipeforge.verify`` before it is
returned, and never worse than the input (which is returned unchanged when nothing beats it); before,
after, the proven bound and why the search stopped. Nothing runs past ``time_limit``, the final check
included (``budget.py``). ``VerificationError`` if the result does not verify; explicit ``exact``
raises ``UsageError`` for a problem too large for its model. How each strategy works:
``docs/optimize.md``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace

from pipeforge.errors import Argument, ArgumentError, UsageError, VerificationError, words
from pipeforge.ir import Action, ActionKind, CostModel, MemorySpec, Schedule, Step
from pipeforge.optimizer import greedy, list_schedule, v_greedy
from pipeforge.optimizer.budget import finish_seconds, search_deadline, timed
from pipeforge.optimizer.evaluate import (Evaluation, Graph, Order, Problem, compute_actions, evaluate, is_complete,
                                          schedule_of)
from pipeforge.optimizer.fuse import FuseSearch, fusable_stages
from pipeforge.optimizer.local import local_search
from pipeforge.optimizer.placement import (PLACEMENTS, Layout, chunk_costs, common_chunks, laid_out_schedule, layouts,
                                           scale_costs)
from pipeforge.optimizer.result import STOP_REASONS, Metrics, OptimizeResult, metrics_of
from pipeforge.optimizer.units import integer_units
from pipeforge.semantics import COMPLETE, PLAIN_KINDS, SPLIT_WORK, split, within_limit
from pipeforge.sim.bounds import WorkBound, bubble_of_span, work_bound
from pipeforge.verifier import verify

STRATEGIES = ("auto", "greedy", "local", "exact")
EXACT_AUTO_ACTIONS = 96   # auto runs exact search up to P * M * 3 = 96 (P=4, M=8)
EXACT_SHARE_FUSING = 0.7  # explicit exact's share of the time where some B < I + W (the fuse descents get the rest)
ASAP_ACTIONS = 48         # up to this size the z3 model also fixes ASAP timing (optimal = what sim reports)
LIST_SCHEDULE_ACTIONS = 300  # beside a Zero Bubble builder, list scheduling runs only up to this size
LIST_SCHEDULE_MAX = 12000    # and alone up to this one (it is quadratic in the actions of a rank)
Progress = Callable[[float, str], None]


@dataclass(frozen=True)
class _Candidate:
    graph: Graph
    order: Order
    evaluation: Evaluation
    found_by: str


@dataclass(frozen=True)
class _Outcome:
    """What the search found in one layout (times in integer units)."""

    layout: Layout
    split: Graph
    best: _Candidate | None
    span_bound: float
    stopped: str
    static: WorkBound | None = None  # sim.bounds' bound before any search (exact search may prove more)
    fusing: str | None = None  # which fuse pass ran (result.FUSE_PASSES)
    split_bound: float | None = None  # explicit exact's bound on orders of the split work only

    @property
    def found(self) -> _Candidate:
        """``best``, of an outcome that has one."""
        assert self.best is not None, "asked of an outcome whose search found an order"
        return self.best


def split_actions(actions: list[Action]) -> list[Action]:
    """The same work with every B split into I and W (the Zero Bubble split, ``semantics.split``)."""
    return [part for a in actions for part in split(a)]


def optimize(schedule: Schedule, *, costs: CostModel | None = None, memory_limit: float | None = None,
             strategy: str = "auto", time_limit: float = 10.0, progress: Progress | None = None,
             weights: float | None = None, placement: str = "keep") -> OptimizeResult:
    """A schedule at least as good as ``schedule`` under ``costs`` and ``memory_limit`` (see the module doc);
    ``weights`` (M_W / M_B) overrides the schedule's; ``placement`` (``placement.py``) lets it lay the
    stages out anew."""
    if strategy not in STRATEGIES:
        raise UsageError(f"unknown strategy {strategy!r}; expected one of {', '.join(STRATEGIES)}")
    if time_limit <= 0:
        raise UsageError(f"the time limit must be positive, got {time_limit!r}")
    started = time.monotonic()
    return _optimize(schedule, costs, memory_limit, strategy, time_limit, progress, weights, placement, started)


def _optimize(schedule: Schedule, costs: CostModel | None, memory_limit: float | None, strategy: str,
              time_limit: float, progress: Progress | None, weights: float | None, placement: str,
              started: float) -> OptimizeResult:
    compute = schedule.compute_only()
    _require_complete(compute)
    given = Problem.of(compute, costs, memory_limit)
    if weights is not None:
        given = replace(given, weights=weights)
    tried = layouts(placement, given)
    chunks = common_chunks(tried)
    units = integer_units(given.costs)
    # Every search times orders in exact integer units (units.py): the same result whatever the unit;
    # times ``chunks`` so that every layout's chunk costs are integers too.
    base = replace(given, costs=scale_costs(units.costs, chunks))
    before = metrics_of(compute, base.costs, base.memory)
    if base.memory_limit is None:
        base = replace(base, memory_limit=max(before.peak_memory, default=0.0))
    # Every layout's bound, then their greedy orders, the layout with the lowest bound first (a layout
    # whose bound another's order reaches is skipped), then the rest of the time on the one that leads.
    runs = [_layout_run(compute, base, layout, strategy, progress) for layout in tried]
    # The time limit covers verifying and writing the result (budget.py): the search stops before that.
    deadline = search_deadline(started, time_limit, max(run.finish for run in runs))
    for run in runs:
        run.deadline = deadline
    for run in sorted(runs, key=lambda run: run.bound):
        leading = min((run.best for run in runs if run.best is not None), key=lambda c: c.evaluation.key(),
                      default=None)
        run.start(strategy, None if leading is None else leading.evaluation.max_span)
    leader = min(runs, key=lambda run: run.key())
    leader.improve(strategy)
    outcomes = [_Outcome(run.layout, run.split, run.best, run.bound, run.stopped, run.static, run.fusing,
                         run.split_bound) for run in runs]
    result = _result(schedule, compute, before, outcomes, given, strategy, started)
    return _in_units(result, units.scale / chunks, [layout.describe(given) for layout in tried])


def _layout_run(compute: Schedule, base: Problem, layout: Layout, strategy: str,
                progress: Progress | None) -> _Search:
    """A run in ``layout``: its work graph (compiled once, timed for ``budget.finish_seconds``) and its
    proven bound; its deadline is set once every layout's is known."""
    problem = layout.problem(base)
    if layout.keeps:
        work = split_actions(compute_actions(compute))
        source = (lambda: _input_candidate(problem, compute)) if strategy in ("auto", "local") else None
    else:
        work = [Action(s, kind, mb) for s in range(problem.stages) for mb in range(problem.microbatches)
                for kind in SPLIT_WORK]
        source = None
    split, seconds = timed(lambda: Graph(problem, work))
    if strategy == "exact" and layout.keeps:
        _require_exact_size(split)
    return _Search(layout, problem, split, finish_seconds(len(work), seconds), progress, source)


def _require_exact_size(split: Graph) -> None:
    from pipeforge.optimizer.exact import MAX_ORDER_PAIRS, order_pairs

    pairs = order_pairs(split)
    if pairs > MAX_ORDER_PAIRS:
        raise ArgumentError(Argument("strategy", value="exact"), words(
            f"this schedule needs {pairs} ordering decisions (pairs of actions on one rank), more than exact search "
            f"can settle ({MAX_ORDER_PAIRS}, about 4 ranks x 8 microbatches); use ",
            Argument("strategy", value="auto or local")), value="exact")




def _require_complete(compute: Schedule) -> None:
    """Every (stage, microbatch, chain) once forward and once backward (B, or I and W), on its rank."""
    seen: dict[tuple[int, int | None, int], list[ActionKind]] = {}
    for rank, index, action in compute.actions():
        if action.kind not in PLAIN_KINDS:
            raise VerificationError(f"{action} (rank {rank}, step {index}): optimize does not yet reorder "
                                    f"{action.kind.value} actions (recompute and offload); optimize the schedule "
                                    f"without them, then add them (pipeforge.passes.recompute)")
        if compute.rank_of(action.stage, action.chain) != rank:
            raise VerificationError(f"{action} runs on rank {rank}, which does not own stage {action.stage}")
        seen.setdefault((action.stage, action.microbatch, action.chain), []).append(action.kind)
    for chain in range(compute.chains):
        for stage in range(compute.stages):
            for mb in range(compute.microbatches):
                kinds = tuple(sorted(seen.pop((stage, mb, chain), [])))
                if kinds not in COMPLETE and (kinds or compute.chains == 1):
                    raise VerificationError(f"stage {stage}, microbatch {mb}: expected F and B (or F, I and W), "
                                            f"found {' '.join(kinds) or 'nothing'}; optimize needs a complete schedule")
    if seen:
        raise VerificationError(f"actions outside the schedule's stages or microbatches: {sorted(seen)[:3]}")


class _Search:
    """One optimization: the candidates found so far and the time left."""

    def __init__(self, layout: Layout, problem: Problem, split: Graph, finish: float, progress: Progress | None,
                 source_of: Callable[[], _Candidate | None] | None):
        self.layout, self.problem, self.split, self.progress = layout, problem, split, progress
        self.finish = finish  # seconds to verify and write this layout's result (budget.finish_seconds)
        self.deadline = float("inf")  # set by optimize once every layout's finish is known
        self.source_of = source_of
        self.source: _Candidate | None = None
        self.best: _Candidate | None = None
        self.static = work_bound(split, problem.memory_limit)
        self.bound = self.static.max_span
        self.stopped = "finished"
        self.fusing: str | None = None  # which fuse pass ran (result.FUSE_PASSES), None: no stage has B < I + W
        self.split_bound: float | None = None  # explicit exact's bound where it covers the split work only

    def key(self) -> tuple:
        """Runs with a candidate first, the best candidate first."""
        return (0, self.best.evaluation.key()) if self.best is not None else (1, ())

    def left(self) -> float:
        return max(0.0, self.deadline - time.monotonic())

    def tell(self, fraction: float, message: str) -> None:
        if self.progress is not None:
            self.progress(fraction, message)

    def fits(self, candidate: _Candidate | None) -> bool:
        return candidate is not None and candidate.evaluation.fits(self.problem.memory_limit)

    def offer(self, candidate: _Candidate | None) -> None:
        if candidate is None or not self.fits(candidate):
            return
        if self.best is None or candidate.evaluation.key() < self.best.evaluation.key():
            self.best = candidate

    def start(self, strategy: str, to_beat: float | None = None) -> None:
        """The proven bound and the first candidates: the input (for local search) and the greedy orders.
        The input becomes a candidate only when local search needs it (it costs a graph of its own).
        No greedy order is built when ``to_beat`` (another layout's worst span) is at or below this
        layout's bound (none could beat it), nor past the deadline when another layout has an order."""
        if self.source_of is not None and strategy == "local":
            self.source = self.source_of()
        self.offer(self.source)
        hopeless = to_beat is not None and (to_beat <= self.bound + 1e-9 or self.left() <= 0)
        # local search starts from the input where it fits the limit, else from the greedy orders
        if (strategy in ("auto", "greedy", "exact") or self.best is None) and not hopeless:
            self.greedy(required=strategy == "greedy", bound=self.bound)
        if self.reached(self.bound):
            self.stopped = "bound"

    def improve(self, strategy: str) -> None:
        """Local search, then exact search, as ``strategy`` asks, until the bound or the deadline
        (``self.stopped`` says why it stopped)."""
        bound, small = self.bound, len(self.split.actions) <= EXACT_AUTO_ACTIONS
        if strategy == "auto" and self.source_of is not None and not self.reached(bound):
            self.source = self.source_of()  # also a seed of the fuse search
            self.offer(self.source)
        fusing = bool(fusable_stages(self.problem))
        if fusing:
            self.fusing = "search" if strategy in ("local", "auto") else strategy
        if strategy in ("local", "auto") and not self.reached(bound):
            start = self.source if strategy == "local" and self.fits(self.source) else self.best
            share = 0.3 if fusing else 0.25 if strategy == "auto" and small else 1.0  # the rest to fuse or exact
            self.local(start, self.left() * share, bound)
        # exact search orders the split work only: where fusing some B may win, its orders are not the space
        # searched and its bound is no bound on the others, so auto leaves the time to the fuse search, and
        # explicit exact keeps its bound apart (``split_bound``) and leaves the fuse descents their share
        if strategy == "exact" and fusing and not self.reached(bound):
            self.split_bound = self.exact(bound, self.left() * EXACT_SHARE_FUSING)
        elif (strategy == "exact" or (strategy == "auto" and small and not fusing)) and not self.reached(bound):
            self.bound = bound = max(bound, self.exact(bound, self.left()))
        if fusing and not self.reached(bound):
            self.fuse(bound, local=strategy in ("local", "auto"))
        if self.reached(bound):
            self.stopped = "bound"

    def reached(self, bound: float) -> bool:
        return self.best is not None and self.best.evaluation.max_span <= bound + 1e-9

    def greedy(self, required: bool, bound: float) -> None:
        """The Zero Bubble scheduler where it applies; list scheduling for other placements and small cases."""
        zero_bubble = greedy.supports(self.problem) or v_greedy.supports(self.problem)
        size = len(self.split.actions)
        listed = list_schedule.supports(self.problem) and size <= (
            LIST_SCHEDULE_ACTIONS if zero_bubble else LIST_SCHEDULE_MAX)
        if required and not (zero_bubble or list_schedule.supports(self.problem)):
            raise UsageError(words("the greedy strategies need a schedule with one chain (not a bidirectional one); "
                                   "try ", Argument("strategy", value="local")))
        if greedy.supports(self.problem):
            self.tell(0.0, "greedy: the Zero Bubble scheduler's eight settings")
            found = greedy.best_zero_bubble_order(self.problem, stop_at=bound)
            if found is not None:
                self.offer_keys(found.keys, "greedy")
        if v_greedy.supports(self.problem):
            self.tell(0.02, "greedy: the Zero Bubble V scheduler's settings")
            for _, keys in v_greedy.zero_bubble_v_orders(self.problem, self.deadline):
                self.offer_keys(keys, "greedy-v")
        if listed and not self.reached(bound) and (self.left() > 0 or self.best is None):
            self.tell(0.05, "greedy: list scheduling")
            for _, keys in list_schedule.list_schedule_orders(self.problem, self.deadline):
                self.offer_keys(keys, "list")

    def offer_keys(self, keys, found_by: str) -> None:
        order = tuple(self.split.ids(rank_keys) for rank_keys in keys)
        evaluation = evaluate(self.split, order)
        if evaluation is not None:
            self.offer(_Candidate(self.split, order, evaluation, found_by))

    def local(self, start: _Candidate | None, seconds: float, bound: float) -> None:
        if start is None:
            return
        if seconds <= 0:  # the finish took all the time there was (a slow or loaded machine): that is a stop by time
            self.stopped = "time"
            return
        self.tell(0.1, "local search")
        found = local_search(start.graph, start.order, time_limit=seconds, target=bound, progress=self.progress)
        self.offer(_Candidate(start.graph, found.order, found.evaluation, "local"))
        self.stopped = "time" if self.left() <= 0 else "stalled"

    def fuse(self, bound: float, local: bool) -> None:
        """Keep B fused or split it per (stage, microbatch) (``fuse.py``), from the best order and the input:
        the fuse search with local search between its descents (``local``), else its descents alone."""
        seeds = [(c.graph, c.order) for c in (self.best, self.source) if c is not None]
        if not seeds:
            return
        if self.left() <= 0:
            self.stopped = "time"
            return
        self.tell(0.4, "fuse search: keep B whole or split it")
        found = FuseSearch(self.split, self.deadline, bound, self.progress).run(seeds, local=local)
        if found is not None:
            self.offer(_Candidate(found[0], found[1], found[2], "fuse"))
        self.stopped = "time" if self.left() <= 0 else "stalled"

    def exact(self, bound: float, seconds: float) -> float:
        """Run z3 from the best order so far on the split work; returns its proven span bound."""
        from pipeforge.optimizer.exact import TooLarge, solve_exact

        incumbent = self.best if self.best is not None and self.best.graph is self.split else None
        if incumbent is None:
            return 0.0
        if seconds <= 0:
            self.stopped = "time"
            return 0.0
        self.tell(0.5, "exact search (z3)")
        small = len(self.split.actions) <= ASAP_ACTIONS
        try:
            found = solve_exact(self.split, incumbent.order, bound, time_limit=seconds, asap=small,
                                progress=self.progress)
        except TooLarge:
            return 0.0
        evaluation = evaluate(self.split, found.order)
        assert evaluation is not None, "z3's order has start times for every action: it runs to the end"
        self.offer(_Candidate(self.split, found.order, evaluation, "exact"))
        # proven optimal among orders of the split work: the result is optimal only where no B < I + W
        self.stopped = ("bound" if self.fusing is None else "finished") if found.optimal else "time"
        return found.lower_bound


def _input_candidate(problem: Problem, compute: Schedule) -> _Candidate | None:
    """The input's order as a candidate; an overlap step's actions run one after the other there (an
    order holds one action a step), which makes it another schedule than the input, found by "sequential"."""
    overlaps = any(len(step.actions) != 1 for _, _, step in compute.steps())
    graph = Graph(problem, compute_actions(compute))
    order = graph.order_of(compute)
    evaluation = evaluate(graph, order)
    return None if evaluation is None else _Candidate(graph, order, evaluation, "sequential" if overlaps else "input")


def _result(schedule: Schedule, compute: Schedule, before: Metrics, outcomes: list[_Outcome], given: Problem,
            strategy: str, started: float) -> OptimizeResult:
    """The best outcome as a result, still in integer units (``_in_units`` converts it)."""
    memory_limit = outcomes[0].split.problem.memory_limit
    assert memory_limit is not None, "optimize sets the limit (the input's peak where none is given)"
    limit = memory_limit / outcomes[0].layout.chunks
    within = within_limit(max(before.peak_memory, default=0.0), limit)
    found = [o for o in outcomes if o.best is not None]
    chosen = min(found, key=lambda o: o.found.evaluation.key(), default=None)
    span_bound = min(o.span_bound for o in outcomes)
    if chosen is None or not _beats_input(chosen.found, before, within):
        if not within:
            raise VerificationError(f"no order of {schedule.name!r} within the memory limit {limit:g} was found "
                                    f"(the input holds {max(before.peak_memory):g})")
        result, after, found_by, layout, stopped = _with_weights(schedule, given), before, "input", Layout("keep"), \
            outcomes[0].stopped
    else:
        best, layout, stopped = chosen.found, chosen.layout, chosen.stopped
        result = _schedule_of(schedule, compute, chosen, given.costs)
        _verify(result, chosen.split.problem.memory_limit, best)
        after, found_by = Metrics.of(best.evaluation), best.found_by
        after = replace(after, peak_memory=tuple(peak / layout.chunks for peak in after.peak_memory))
    span_bound = min(span_bound, after.max_span)
    gap = (after.max_span - span_bound) / after.max_span if after.max_span > 0 else 0.0
    # every layout's work is the same (chunks divide it), so the same least work per rank (result.py)
    least_work = lambda span: bubble_of_span(outcomes[0].split, span)  # noqa: E731
    before, after, bound = before.with_least_work(least_work), after.with_least_work(least_work), least_work(span_bound)
    return OptimizeResult(result, before, after, bound, span_bound, gap, gap <= 1e-6, found_by != "input",
                          found_by, strategy, time.monotonic() - started, limit,
                          "bound" if gap <= 1e-6 else stopped, layout.describe(given),
                          work_bound=_static_bound(outcomes), fuse=next((o.fusing for o in outcomes if o.fusing), None),
                          split_bound=next((o.split_bound for o in outcomes if o.split_bound is not None), None))


def _static_bound(outcomes: list[_Outcome]) -> WorkBound | None:
    """``sim.bounds``' bound on every schedule of the work in the input's placement (integer units)."""
    return next((o.static for o in outcomes if o.layout.keeps), None)


def _with_weights(schedule: Schedule, given: Problem) -> Schedule:
    """The input, carrying the M_W / M_B it was optimized with when that is not its own."""
    memory = schedule.memory or MemorySpec()
    if memory.weights == given.weights:
        return schedule
    return replace(schedule, memory=replace(memory, weights=given.weights))


def _schedule_of(schedule: Schedule, compute: Schedule, outcome: _Outcome, costs: CostModel) -> Schedule:
    """The chosen order as a schedule with the input's costs (divided into chunks where it was split)."""
    best, layout = outcome.found, outcome.layout
    if layout.keeps:
        return replace(schedule_of(compute, best.graph, best.order, name=schedule.name), costs=costs)
    programs = tuple(tuple(Step((best.graph.actions[a],)) for a in seq) for seq in best.order)
    laid = laid_out_schedule(compute, outcome.split.problem, programs, chunk_costs(costs, layout.chunks))
    return replace(laid, name=schedule.name)


def _in_units(result: OptimizeResult, scale: float, tried: list[str]) -> OptimizeResult:
    """``result`` with its times in the input's unit (they were integer units times ``1 / scale``)."""
    static = result.work_bound
    if static is not None:
        static = static.scaled(scale)
    split_bound = None if result.split_bound is None else result.split_bound * scale
    return replace(result, before=result.before.scaled(scale), after=result.after.scaled(scale),
                   span_bound=result.span_bound * scale, placements_tried=tuple(tried), work_bound=static,
                   split_bound=split_bound)


def _beats_input(best: _Candidate, before: Metrics, within: bool) -> bool:
    """Strictly better than the input on worst span, then total span, then makespan (any order
    within the limit beats an input over it)."""
    if best.found_by == "input":
        return False
    return not within or best.evaluation.key()[:3] < before.key()


def _verify(result: Schedule, memory_limit: float | None, candidate: _Candidate) -> None:
    """Refuse to return an order that is incomplete, stuck or over the memory limit.

    Two independent checks: the optimizer's own (every action once on its rank,
    the ASAP run finishes, the program-order memory fits) and ``pipeforge.verify``
    on the lowered result, every check of ``pipeforge verify`` included. Its
    timing is settled by the certificate (the event pass proposes a start time
    for every step, z3 checks them against the timing model: a satisfying
    assignment, so a proof that nothing waits forever) rather than by z3
    deciding the model with free start times (``solve``), which adds only a
    cross-check of the event pass and, on small schedules, most of the time.
    """
    graph, order, evaluation = candidate.graph, candidate.order, candidate.evaluation
    if not is_complete(graph, order) or evaluation is None or not evaluation.fits(memory_limit):
        raise VerificationError(f"the optimized order of {result.name!r} is incomplete, stuck or over the memory limit")
    report = verify(result, memory_limit=memory_limit, solve=False)
    if not report.valid:
        first = report.violations[0] if report.violations else None
        detail = f": {first.message}" if first is not None else ""
        raise VerificationError(f"the optimized schedule does not verify{detail}", report)


__all__ = ["Metrics", "OptimizeResult", "PLACEMENTS", "STOP_REASONS", "STRATEGIES", "optimize"]
