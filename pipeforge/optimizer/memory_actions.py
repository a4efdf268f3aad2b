"""optimize with recompute and offload: which (stage, microbatch) to recompute or offload under a memory limit.

``optimize_memory(schedule, recompute=none|auto|all, offload=False, ...)`` -> ``(OptimizeResult,
MemoryChoice)``: the schedule of the same work with the least makespan (then worst span, which each plan's
search minimizes) among the plans the policy allows (``PLANS``: no recompute; every microbatch recomputed;
R chosen per (stage, microbatch) and placed while scheduling, ``recompute_greedy``; every k-th microbatch
per stage; every activation offloaded), verified within the real limit (``pipeforge.verify``), and what it
chose. ``time_limit`` bounds the whole call. How each plan is built: ``docs/optimize.md`` (Recompute and
offload).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace

from pipeforge.errors import Argument, ArgumentError, PipeforgeError, UsageError, words
from pipeforge.library import load_library_schedule
from pipeforge.ir import Action, ActionKind, CostModel, MemorySpec, Schedule, Step, replace_programs
from pipeforge.optimizer import recompute_greedy
from pipeforge.optimizer.budget import finish_seconds
from pipeforge.optimizer.evaluate import Evaluation, Graph, Order, Problem, evaluate, schedule_of
from pipeforge.optimizer.exact import MAX_ORDER_PAIRS, Choices, ExactResult, TooLarge, order_pairs, solve_exact
from pipeforge.optimizer.local import local_search
from pipeforge.optimizer.offload_place import placed_offloads, weights_climbed, weights_filled, weights_within
from pipeforge.optimizer.result import Metrics, OptimizeResult, metrics_of
from pipeforge.optimizer.search import ASAP_ACTIONS, optimize
from pipeforge.optimizer.units import integer_units
from pipeforge.passes.recompute import offload as offload_pass
from pipeforge.passes.recompute import recompute as recompute_pass
from pipeforge.semantics import SAVING, split, stage_effect, within_limit
from pipeforge.sim.bounds import bubble_of_span, recompute_span
from pipeforge.sim.simulate import simulate
from pipeforge.sim.workgraph import Shape, WorkGraph, compile_actions
from pipeforge.verifier import verify

POLICIES = ("none", "auto", "all")
PLANS = ("none", "all", "per-microbatch", "exact", "selective", "offload")  # what auto tries, in the order reported
EXACT_ACTIONS = 64  # auto's exact search (R chosen too) up to this many actions beside the R (P = 4, M = 5)


@dataclass(frozen=True)
class MemoryChoice:
    """What ``optimize_memory`` chose: the policy, and how many (stage, microbatch) it recomputes and offloads."""

    recompute: str
    offload: bool
    recomputed: int
    offloaded: int
    tried: tuple[str, ...]

    def to_json(self) -> dict:
        return {"recompute": self.recompute, "offload": self.offload, "recomputed": self.recomputed,
                "offloaded": self.offloaded, "tried": list(self.tried)}


def strip(schedule: Schedule) -> Schedule:
    """``schedule`` without its R, OFFLOAD and RELOAD steps (what the order search reorders)."""
    programs = tuple(tuple(step for step in program if not (step.actions and step.actions[0].kind in SAVING))
                     for program in schedule.programs)
    if any(a.kind in SAVING for program in programs for step in program for a in step.actions):
        raise UsageError("an overlap step holds R, OFFLOAD or RELOAD: optimize cannot take it apart")
    return replace_programs(schedule, programs)


def fused(schedule: Schedule) -> Schedule:
    """``schedule`` with each I made a B and its W dropped (the backward whole, where the I was)."""
    programs = []
    for program in schedule.programs:
        steps = []
        for step in program:
            if len(step.actions) == 1 and step.actions[0].kind is ActionKind.W:
                continue
            if len(step.actions) == 1 and step.actions[0].kind is ActionKind.I:
                step = Step((step.actions[0]._replace(kind=ActionKind.B),), span=step.span)
            steps.append(step)
        programs.append(tuple(steps))
    return replace_programs(schedule, tuple(programs))


def selective(schedule: Schedule, costs: CostModel, memory: MemorySpec) -> Schedule | None:
    """The input's order with stage s recomputing every k_s-th microbatch, each k_s the largest (the least
    recompute) whose rank fits ``memory.limit``: found for every stage at once by halving each stage's range
    (what one rank holds depends only on its own stages' recompute). None when even k_s = 1 does not fit."""
    stages, m, limit = schedule.stages, schedule.microbatches, memory.limit
    assert limit is not None, "selective is asked only under a memory limit"
    low, high = [1] * stages, [m + 1] * stages  # k in [low, high): low fits (or is 1), high does not
    owner = [schedule.rank_of(s) for s in range(stages)]

    def build(ks: list[int]) -> Schedule:
        which = [(s, b, 0) for s in range(stages) for b in range(m) if ks[s] <= m and b % ks[s] == 0]
        return replace(recompute_pass(schedule, which), memory=memory)

    while any(high[s] - low[s] > 1 for s in range(stages)):
        ks = [(low[s] + high[s]) // 2 if high[s] - low[s] > 1 else low[s] for s in range(stages)]
        peaks = simulate(build(ks), costs).peak_memory
        for s in range(stages):
            if high[s] - low[s] > 1:
                if within_limit(peaks[owner[s]], limit):
                    low[s] = ks[s]
                else:
                    high[s] = ks[s]
    # where even the largest k fits, recompute nothing there (k = m + 1 names no microbatch); the peaks are
    # simulate's (the rule verify checks; the chosen schedule is verified by the caller)
    ks = [low[s] for s in range(stages)]
    found = build(ks)
    if not fits(found):
        return None
    spare = [s for s in range(stages) if high[s] == m + 1]
    if spare:
        trial = build([m + 1 if s in spare else ks[s] for s in range(stages)])
        peaks = simulate(trial, costs).peak_memory
        for s in spare:  # what one rank holds depends only on its own stages' recompute
            if within_limit(peaks[owner[s]], limit):
                ks[s] = m + 1
        found = build(ks)
    return found if fits(found) else None


def uniform(plain: Schedule, costs: CostModel, memory: MemorySpec) -> tuple[Schedule, int] | None:
    """The input's order with every stage recomputing every k-th microbatch (the knob Megatron and
    DeepSpeed offer): k the largest that fits (found by halving: less recompute holds more), or a smaller
    k of a few tried where that is faster; None where even k = 1 does not fit."""
    m = plain.microbatches

    def build(k: int) -> Schedule:
        which = [(s, b, 0) for s in range(plain.stages) for b in range(m) if b % k == 0]
        return replace(recompute_pass(plain, which), memory=memory, costs=costs)

    if not fits(build(1)):
        return None
    low, high = 1, m + 1  # build(low) fits; build(high) does not (m + 1 would recompute microbatch 0 only)
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if fits(build(middle)) else (low, middle)
    spans = {k: simulate(build(k), costs).makespan for k in {low, max(1, low - 1), max(1, low // 2), 1}}
    k = min(spans, key=lambda k: (spans[k], -k))
    return build(k), k


def fits(schedule: Schedule) -> bool:
    """Whether ``schedule`` runs within its memory limit (``simulate``'s peak, the rule verify checks)."""
    limit = schedule.memory.limit if schedule.memory is not None else None
    return within_limit(max(simulate(schedule).peak_memory, default=0.0), limit)


def _plain_result(schedule: Schedule, costs: CostModel, memory: MemorySpec, after: Metrics) -> OptimizeResult:
    """A result standing for ``schedule`` as given (when no search gave one to take the fields from); its
    figures as ``after``'s where the input itself cannot run."""
    try:
        before = metrics_of(schedule, costs, memory)
    except PipeforgeError:
        before = after
    return OptimizeResult(schedule, before, after, 0.0, 0.0, 0.0, False, False, "input", "none", 0.0)


def recompute_bound(plain: Schedule, costs: CostModel, real: MemorySpec) -> tuple[WorkGraph, float]:
    """The split work of ``plain`` (every B as I and W, as optimize bounds it: one microbatch's paths stand
    for all) and the least worst span of any of its schedules that may recompute within ``real``'s limit
    (``sim.bounds.recompute_span``)."""
    work = [part for _, _, a in strip(plain).actions() if a.is_compute for part in split(a)]
    graph = compile_actions(Shape.of(plain), work, costs, replace(real, limit=None))
    return graph, recompute_span(graph, real).max_span


def _with_recompute_bound(result: OptimizeResult, plain: Schedule, costs: CostModel,
                          real: MemorySpec, proven: float = 0.0) -> OptimizeResult:
    """``result`` with the bound of the space it was chosen from, where any (stage, microbatch) may be
    recomputed (``sim.bounds.recompute_span``: the recompute the limit forces counted; or ``proven``, exact
    search's, where higher), its gap and verdict."""
    graph, bound = recompute_bound(plain, costs, real)
    bound = max(bound, proven)
    span = result.after.max_span
    gap = max(0.0, (span - bound) / span) if span > 0 else 0.0
    least = lambda span: bubble_of_span(graph, span)  # noqa: E731
    # a plan built beside optimize (per-microbatch) has no rates on the least work yet: the same graph's
    before, after = (m if m.least_work_bubble_rate is not None else m.with_least_work(least)
                     for m in (result.before, result.after))
    return replace(result, before=before, after=after, span_bound=bound, bound=least(bound), gap=gap,
                   optimal=gap <= 1e-6)


def _dropped_where_room(graph: Graph, order: Order, evaluation: Evaluation) -> tuple[Graph, Order, Evaluation]:
    """``order`` without the R whose activations fit from their F on all the same (``recompute_greedy``'s
    ``kept_where_room``), as an order of its own graph, where that is better; else as it is."""
    keys = [tuple(graph.actions[a] for a in seq) for seq in order]
    kept = [recompute_greedy.kept_where_room(graph.problem, seq) for seq in keys]
    if kept == keys:
        return graph, order, evaluation
    smaller = Graph(graph.problem, [a for seq in kept for a in seq])
    shorter = tuple(smaller.ids(seq) for seq in kept)
    found = evaluate(smaller, shorter)
    if found is None or not found.fits(graph.problem.memory_limit) or found.key() >= evaluation.key():
        return graph, order, evaluation
    return smaller, shorter, found


def exact_recompute(plain: Schedule, real: MemorySpec, units_costs: CostModel,
                    incumbent: tuple[Graph, Order, Evaluation], seconds: float) -> ExactResult | None:
    """z3 over every order of the split work with every (stage, microbatch) recomputed or not
    (``exact.Choices``: each R may be dropped, its F then keeping its activations), from ``incumbent``,
    for ``seconds``: the best order found (of its own graph) and a proven bound on the worst span of any
    schedule of the work that may recompute within ``real``'s limit. None where the model is too large."""
    problem = incumbent[0].problem
    work = [part for _, _, a in strip(plain).actions() if a.is_compute for part in split(a)]
    work += [Action(a.stage, ActionKind.R, a.microbatch, a.chain) for a in work if a.kind is ActionKind.F]
    graph = Graph(problem, work)
    forward = {node: graph.index[Action(a.stage, ActionKind.F, a.microbatch, a.chain)]
               for node, a in enumerate(graph.actions) if a.kind is ActionKind.R}
    kept = {f: (lambda effect: effect[0] - effect[1])(stage_effect(real, ActionKind.F, graph.actions[f].stage))
            for f in forward.values()}
    if order_pairs(graph) > MAX_ORDER_PAIRS:
        return None
    _, lower = recompute_bound(plain, units_costs, real)
    try:
        return solve_exact(graph, incumbent[1], lower, time_limit=seconds, asap=len(graph.actions) <= ASAP_ACTIONS,
                           choices=Choices(forward, kept), start=incumbent[0])
    except TooLarge:
        return None


def per_microbatch(plain: Schedule, real: MemorySpec, units_costs: CostModel, deadline: float
                   ) -> tuple[Graph, Order, Evaluation] | None:
    """The best order ``recompute_greedy`` builds under ``real`` (R chosen per (stage, microbatch) and
    placed in the waits; in ``units_costs``, integer units), None where it does not apply."""
    problem = replace(Problem.of(replace(plain, memory=real), None, real.limit), costs=units_costs)
    if not recompute_greedy.supports(problem):
        return None
    best = None
    for _, keys in recompute_greedy.recompute_orders(problem, deadline):
        graph = Graph(problem, [Action(*key) for seq in keys for key in seq])
        order = tuple(graph.ids(seq) for seq in keys)
        evaluation = evaluate(graph, order)
        if evaluation is not None and evaluation.fits(real.limit) and (
                best is None or evaluation.key() < best[2].key()):
            best = (graph, order, evaluation)
    return best


def optimize_memory(schedule: Schedule, *, recompute: str = "none", offload: bool = False,
                    costs: CostModel | None = None, memory_limit: float | None = None, **options
                    ) -> tuple[OptimizeResult, MemoryChoice]:
    """The best verified schedule of ``schedule``'s work under ``memory_limit`` with the recompute policy
    and offload switch given (module doc), and what it chose. ``options`` go to ``optimize``; its
    ``time_limit`` (default 10 s) bounds the whole call, the final verification included."""
    if recompute not in POLICIES:
        raise ArgumentError(Argument("recompute", value=repr(recompute)), f"expected one of {', '.join(POLICIES)}")
    started = time.monotonic()
    time_limit = options.pop("time_limit", 10.0)
    strategy = options.get("strategy", "auto")
    plain = strip(schedule)
    memory = schedule.memory or MemorySpec()
    limit = memory_limit if memory_limit is not None else memory.limit
    costs = costs or schedule.costs or CostModel()
    weights = options.pop("weights", None)
    if weights is not None:
        memory = replace(memory, weights=weights)
    real = replace(memory, limit=limit)
    unlimited = replace(memory, limit=None)
    stages = range(schedule.stages)
    rebuilt = max((memory.stage_activation(s) - memory.stage_checkpoint(s) for s in stages), default=0.0)
    largest = max((memory.stage_activation(s) for s in stages), default=1.0)
    actions = sum(1 for _ in plain.actions()) * 2
    finish = 2 * finish_seconds(actions, 0.0)  # timing and verifying the chosen schedule (budget.py's estimate)
    deadline = started + max(0.0, time_limit - finish)
    candidates: list[tuple[OptimizeResult, str, bool]] = []
    units = integer_units(costs)
    tried: list[str] = []
    errors: list[str] = []

    def left(share: float = 1.0) -> float:
        return max(0.0, deadline - time.monotonic()) * share

    def offer(name: str, final: Schedule, base: OptimizeResult | None = None, verified: bool = False,
              timed: Evaluation | None = None, found_by: str = "input") -> Metrics | None:
        """A candidate, with its figures (``timed``: the engine's, in integer units, instead of simulating),
        which it returns (None where it cannot run). One built here (no ``base``: an optimize result of its
        own) was ordered by ``found_by`` ("input": the input's order, memory actions added) and is not the
        input, which recomputes and offloads nothing."""
        spec = real if limit is not None else unlimited
        final = replace(final, memory=spec)
        try:
            after = metrics_of(final, costs, spec) if timed is None else Metrics.of(timed).scaled(units.scale)
        except PipeforgeError as error:  # e.g. the input's own order with R added cannot run
            errors.append(f"{name}: {error}")
            return None
        if base is None:
            base = candidates[0][0] if candidates else _plain_result(plain, costs, memory, after)
            base = replace(base, found_by=found_by, improved=True, strategy=strategy)
        else:
            after = replace(after, least_work_bubble_rate=base.after.least_work_bubble_rate)
        candidates.append((replace(base, schedule=final, after=after, memory_limit=limit), name, verified))
        return after

    def attempt(name: str, virtual: MemorySpec, virtual_limit: float | None, transform, share: float) -> bool:
        if name not in tried:
            tried.append(name)
        if virtual_limit is not None and virtual_limit <= 0:
            errors.append(f"{name}: no room under the limit")
            return False
        if candidates and left() <= 0:
            errors.append(f"{name}: no time left")
            return False
        try:
            result = optimize(replace(plain, memory=virtual), costs=costs, memory_limit=virtual_limit,
                              weights=virtual.weights, time_limit=max(left(share), 1e-3), **options)
        except PipeforgeError as error:
            errors.append(f"{name}: {error}")
            return False
        offer(name, result.schedule if transform is None else transform(result.schedule), result,
              verified=transform is None)
        return True

    plans = [name for name, wanted in (("none", recompute in ("none", "auto")),
                                       ("per-microbatch", recompute == "auto" and limit is not None),
                                       ("all", recompute == "all" or (recompute == "auto" and limit is not None)),
                                       ("offload", offload)) if wanted]
    # where the input fits, an order without recompute is the likely winner (and must not lose for want of
    # time): it runs first with most of the time; where it does not, one that recomputes nothing is rarely
    # close, and the per-microbatch orders come first
    began = time.monotonic()
    try:
        promising = limit is None or fits(replace(plain, memory=real))
    except PipeforgeError:
        promising = False
    simulating = time.monotonic() - began  # one simulation of this work: what selective and uniform repeat
    if "none" in plans and promising:
        attempt("none", memory, limit, None, 1.0 if len(plans) == 1 else 0.6)
    placed = None
    greedy_seconds = 0.0
    if "per-microbatch" in plans:
        tried.append("per-microbatch")
        began = time.monotonic()
        placed = per_microbatch(plain, real, units.costs, began + left(0.25))
        greedy_seconds = time.monotonic() - began
        if placed is not None:
            offer("per-microbatch", replace(schedule_of(plain, placed[0], placed[1]), costs=costs), timed=placed[2],
                  found_by="greedy")
    if recompute == "auto" and limit is not None:
        # the knob Megatron offers, whatever the time: auto is never behind it
        tried.append("selective")
        same = uniform(plain, costs, real)
        if same is not None:
            offer("selective", same[0])
    # (its first greedy orders take about as long as the per-microbatch ones, whatever its share of the time)
    # an order that recomputes and offloads nothing rarely fits where the input does not: with offload, only
    # where offload's orders fit nothing (below)
    if "none" in plans and not promising and not offload and (placed is None or left() > 4 * greedy_seconds):
        attempt("none", memory, limit, None, 1.0 if len(plans) == 1 else 0.15)
    elif "none" in plans and not promising and not offload:
        tried.append("none")
        errors.append("none: no time left")
    if "all" in plans:
        # a recomputed F holds its checkpoint c; R adds a - c just before the backward, so the search keeps
        # that much room under the limit. First as if I released all but c's weight part (true when each W
        # follows its I closely), and where the result goes over the limit, counting the weight-gradient part
        # w an I leaves until its W from the F on (always within the limit).
        room = None if limit is None else limit - rebuilt
        # (a checkpoint of 0 searched as 1 % of the activation: the search counts forwards by their memory)
        kept = [max(memory.stage_checkpoint(s), 0.01 * memory.stage_activation(s)) for s in stages]
        optimistic = replace(memory, activation=tuple(kept), weight_grad=())
        given = recompute_pass(plain)  # the input's own order, every microbatch recomputed
        offer("all", given)
        if recompute == "all" or placed is None:  # (auto: where the per-microbatch orders do not apply)
            attempt("all", optimistic, room, recompute_pass, 0.2 if recompute == "auto" else 0.4)
        if recompute == "all":
            attempt("all", optimistic, room, lambda s: recompute_pass(fused(s)), 0.5)  # each W into its I: a B
            careful = replace(memory, activation=tuple(kept[s] + memory.stage_weight_grad(s) for s in stages),
                              weight_grad=tuple(memory.stage_weight_grad(s) for s in stages))
            attempt("all", careful, room, recompute_pass, 1.0)
    rounds = 2 * max(1, plain.microbatches).bit_length() + 4  # the simulations selective makes, about
    if recompute == "auto" and limit is not None and left() > rounds * simulating:
        tried.append("selective")
        chosen = selective(plain, costs, real)
        if chosen is not None:
            offer("selective", chosen)
    if "offload" in plans:
        tried.append("offload")
        placed_any = _offload_plan(plain, costs, real, unlimited, largest, options, left, offer, errors,
                                   bool(candidates))
        # the fallback: the order found with each F holding only its weight-gradient part, OFFLOAD after each
        # F and RELOAD before each backward (room for two activations: one back, one in flight)
        if not placed_any and "none" in plans and not promising:
            attempt("none", memory, limit, None, 0.3)
        if not placed_any:
            virtual = replace(memory, activation=tuple(max(memory.stage_weight_grad(s), 0.01) for s in stages),
                              weight_grad=tuple(max(memory.stage_weight_grad(s), 0.01) for s in stages))
            attempt("offload", virtual, None if limit is None else limit - 2 * largest, offload_pass, 1.0)
    small = placed is not None and len(placed[0].actions) <= EXACT_ACTIONS
    exact = placed is not None and (strategy == "exact" or (strategy == "auto" and small))
    proven = 0.0  # exact search's bound on schedules that may recompute (units of ``units``)
    if placed is not None and left() > 0:  # the rest of the time: local search on the per-microbatch order
        graph, order, _ = placed
        found = local_search(graph, order, time_limit=left(0.3 if exact else 0.8))  # (then building its schedule)
        placed = _dropped_where_room(graph, found.order, found.evaluation)
        offer("per-microbatch", replace(schedule_of(plain, placed[0], placed[1]), costs=costs), timed=placed[2],
              found_by="local")
    if exact and placed is not None and left() > 0:
        tried.append("exact")
        searched = exact_recompute(plain, real, units.costs, placed, left(0.8))
        if searched is not None:
            proven = searched.lower_bound * units.scale
            evaluation = evaluate(searched.graph, searched.order) if searched.graph is not None else None
            if evaluation is not None and searched.graph is not None:
                offer("per-microbatch", replace(schedule_of(plain, searched.graph, searched.order), costs=costs),
                      timed=evaluation, found_by="exact")
    fitting = sorted(((r, n, v) for r, n, v in candidates
                      if within_limit(max(r.after.peak_memory), limit)),
                     key=lambda c: (c[0].after.makespan, c[0].after.max_span))
    for best, name, verified in fitting:  # the best that verifies (each should: the rules are semantics')
        if verified or verify(best.schedule, solve=False).valid:
            break
        errors.append(f"{name}: its result does not verify")
    else:
        switches = (Argument("recompute", value=recompute), *((" and ", Argument("offload")) if offload else ()))
        raise PipeforgeError(words(f"no schedule of {schedule.name!r}'s work fits the memory limit {limit:g} with ",
                                   *switches, ": " + "; ".join(errors)))
    if recompute != "none" and limit is not None:
        best = _with_recompute_bound(best, plain, costs, real, proven)
    kinds = [a.kind for _, _, a in best.schedule.actions()]
    choice = MemoryChoice(name if name not in ("offload",) else "none", name == "offload",
                          kinds.count(ActionKind.R), kinds.count(ActionKind.OFFLOAD),
                          tuple(sorted(set(tried), key=PLANS.index)))
    return replace(best, seconds=time.monotonic() - started), choice


OFFLOAD_SEEDS = ("zb-h2", "zb-h1")  # library orders of 1F1B's shape whose forwards run ahead: offload's seeds


def _offload_plan(plain: Schedule, costs: CostModel, real: MemorySpec, unlimited: MemorySpec, largest: float,
                  options: dict, left, offer, errors: list[str], others: bool) -> bool:
    """Offload's orders (``offload_place``), best first while time is left: ZB-H2's and ZB-H1's order where
    the input has their shape, and the order ``optimize`` finds with no limit (every forward may be in
    flight; searched only where there is no seed or time is left); each with its W brought forward where
    the weight-gradient parts, which no transfer moves, leave less than two activations of room, then
    offloaded where the limit needs it. Whether one fits."""
    seeds: list[Schedule] = []
    for name in OFFLOAD_SEEDS:
        try:
            seed = load_library_schedule(name, {"P": plain.ranks, "M": plain.microbatches})
        except PipeforgeError:
            continue
        if seed.stages == plain.stages and seed.placements == plain.placements:
            seeds.append(replace(seed, name=plain.name, params=plain.params, costs=plain.costs))
    found: list[Schedule | None] = []

    def unlimited_order() -> Schedule | None:
        if not found:
            found.append(None)
            if seeds and left() <= 0 and others:
                return None
            try:
                found[0] = optimize(replace(plain, memory=unlimited), costs=costs, memory_limit=float(
                    plain.microbatches) * largest * plain.stages, weights=real.weights,
                    time_limit=max(left(0.3), 1e-3), **options).schedule
            except PipeforgeError as error:
                errors.append(f"offload: {error}")
        return found[0]

    limit = real.limit
    if limit is None:
        base = seeds[0] if seeds else unlimited_order()
        if base is not None:
            offer("offload", base, found_by="offload")
        return base is not None
    bases: list = [*seeds, unlimited_order]
    # (a reserve, before a B or I, room for one activation on a rank that never has one away, a slack, and
    # whether the tails' W are run earlier where they fit)
    variants = [(base, 2 * largest, *rest)
                for rest in ((2 * largest, largest, 0.0, True), (2 * largest, largest, 0.0, False),
                             (2 * largest, None, 0.0, False), (largest, None, 0.0, False),
                             (largest, None, largest, False)) for base in bases]
    best: tuple[float, Schedule, float] | None = None  # makespan, the order before its offloads, slack
    for base, reserve, backward_reserve, direct, slack, fill in variants:
        if best is not None and left() <= 0:
            break
        order = base() if callable(base) else base
        if order is None:
            continue
        order = weights_within(order, real, limit - reserve, limit - backward_reserve,
                               None if direct is None else limit - direct)
        if fill:
            order = weights_filled(order, costs, real)
        moved = placed_offloads(order, costs, real, slack)
        after = None if moved is None else offer("offload", moved, found_by="offload")
        if after is not None and (best is None or after.makespan < best[0]):
            best = (after.makespan, order, slack)
    if best is not None and left() > 0:  # the rest of the time: the W of the ranks' tails moved one at a time
        climbed = weights_climbed(replace(best[1], memory=real), costs, real, time.monotonic() + left(), best[2])
        if climbed is not None and climbed[2] < best[0] - 1e-9:
            offer("offload", climbed[1], found_by="offload")
    return best is not None


__all__ = ["POLICIES", "MemoryChoice", "fits", "optimize_memory", "recompute_bound", "strip", "uniform"]
