"""The optimizer's own fast evaluator: a compute order in, makespan, bubble rate and memory out.

The search strategies try thousands of candidate orders, so they work on a
compiled form: every compute action gets an integer id, with its rank, its
duration, its memory delta and its data dependencies (each with the latency of
the edge: ``comm`` across ranks, 0 on one rank). An *order* is, per rank, the
tuple of ids that rank runs, one action a step.

Timing is as-soon-as-possible in program order, as ``pipeforge.sim`` defines it:
an action starts when the previous action on its rank has ended and each of its
dependencies has ended plus the edge latency. Metrics follow DESIGN.md (the
Zero Bubble paper's bubble rate: ``1 - mean(busy) / max(span)``). An order that
cannot run to the end (a rank waits forever) evaluates to ``None``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from pipeforge.ir import Action, ActionKind, CostModel, MemorySpec, Placement, Schedule, Step, replace_programs

F, B, I, W = ActionKind.F, ActionKind.B, ActionKind.I, ActionKind.W
TOLERANCE = 1e-9

Order = tuple[tuple[int, ...], ...]


@dataclass(frozen=True)
class Problem:
    """What every candidate shares: shape, placement, costs and the memory rule."""

    ranks: int
    stages: int
    microbatches: int
    placements: tuple[Placement, ...]
    costs: CostModel
    memory_limit: float | None
    weights: float
    activation: tuple[float, ...] = ()  # per stage, M_B (MemorySpec.activation)
    weight_grad: tuple[float, ...] = ()  # per stage, M_B (MemorySpec.weight_grad)

    @staticmethod
    def of(schedule: Schedule, costs: CostModel | None = None, memory_limit: float | None = None) -> Problem:
        memory = schedule.memory or MemorySpec()
        limit = memory_limit if memory_limit is not None else memory.limit
        return Problem(
            ranks=schedule.ranks, stages=schedule.stages, microbatches=schedule.microbatches,
            placements=schedule.placements, costs=costs or schedule.costs or CostModel(),
            memory_limit=limit, weights=memory.weights, activation=memory.activation,
            weight_grad=memory.weight_grad,
        )

    def rank_of(self, action: Action) -> int:
        return self.placements[action.chain].rank_of(action.stage)

    def duration(self, action: Action) -> float:
        return self.costs.duration(action.kind, action.stage)

    def memory_delta(self, action: Action) -> float:
        added, released = self.memory.stage_effect(action.kind, action.stage)
        return added - released

    @property
    def memory(self) -> MemorySpec:
        """The memory rule as a spec (limit, weights, per-stage activation and weight-gradient sizes)."""
        return MemorySpec(self.memory_limit, self.weights, activation=self.activation, weight_grad=self.weight_grad)


@dataclass(frozen=True)
class Evaluation:
    """The metrics of one order, per DESIGN.md."""

    makespan: float
    bubble_rate: float
    spans: tuple[float, ...]
    busy: tuple[float, ...]
    peak_memory: tuple[float, ...]
    total_end: float = 0.0

    @property
    def max_span(self) -> float:
        return max(self.spans)

    def key(self) -> tuple[float, float, float, float]:
        """What the searches minimize: the worst span, the total span, the makespan, then the sum of
        every action's end (a smooth guide: running an I before a W lowers it)."""
        return (round(self.max_span, 9), round(sum(self.spans), 9), round(self.makespan, 9),
                round(self.total_end, 9))

    def fits(self, limit: float | None) -> bool:
        return limit is None or max(self.peak_memory, default=0.0) <= limit + TOLERANCE


ActionKey = tuple[int, int, str, int]


def action_key(action: Action) -> ActionKey:
    """A plain tuple for ``action`` (hashing it is several times cheaper than hashing the Action,
    whose Enum field hashes in Python); ``_value_`` is the kind's letters, read without the property."""
    return (action.chain, action.stage, action.kind._value_, -1 if action.microbatch is None else action.microbatch)


def stage_growth(problem: Problem) -> dict[str, list[float]]:
    """What one F, I or W changes its rank's held activations by, per kind (its letter) and stage (M_B):
    what the greedy and list schedulers count memory with, as the graph does."""
    memory = problem.memory
    return {kind.value: [added - released for added, released in (memory.stage_effect(kind, s)
                                                                   for s in range(problem.stages))]
            for kind in (F, I, W)}


class Graph:
    """The compiled action set: ids, ranks, durations, memory deltas, dependencies."""

    def __init__(self, problem: Problem, actions: list[Action]):
        self.problem = problem
        self.actions = sorted(set(actions), key=action_key)
        self.index = {action_key(a): i for i, a in enumerate(self.actions)}
        self.rank = [problem.placements[a.chain].stage_to_rank[a.stage] for a in self.actions]
        table = {(k._value_, s): problem.costs.duration(k, s) for k in (F, B, I, W) for s in range(problem.stages)}
        self.duration = [table[(a.kind._value_, a.stage)] for a in self.actions]
        self.delta = [problem.memory_delta(a) for a in self.actions]
        self.deps = [self._dependencies(i, a) for i, a in enumerate(self.actions)]

    def _dependencies(self, i: int, action: Action) -> tuple[tuple[int, float], ...]:
        costs, rank = self.problem.costs, self.rank[i]
        found = []
        for key in predecessor_keys(action_key(action), self.problem.stages, self.index):
            d = self.index[key]
            found.append((d, 0.0 if self.rank[d] == rank else costs.latency(self.actions[d].stage, action.stage)))
        return tuple(found)

    def ids(self, actions: tuple[Action, ...]) -> tuple[int, ...]:
        return tuple(self.index[action_key(a)] for a in actions)

    def ids_of_keys(self, keys: list[ActionKey]) -> tuple[int, ...]:
        return tuple(self.index[k] for k in keys)

    def order_of(self, schedule: Schedule) -> Order:
        """The schedule's compute steps as an order (one action a step; overlap steps are flattened)."""
        return tuple(
            tuple(self.index[action_key(a)] for step in program if step.is_compute for a in step.actions)
            for program in schedule.programs
        )


def predecessor_keys(key: ActionKey, stages: int, present: dict[ActionKey, int]) -> list[ActionKey]:
    """The compute actions an action needs (DESIGN.md, formal model rule 2), as keys."""
    c, s, kind, m = key
    if kind == "F":
        return [(c, s - 1, "F", m)] if s > 0 else []
    if kind == "W":
        return [(c, s, "I", m)]
    needs = [(c, s, "F", m)]
    if s < stages - 1:
        later = (c, s + 1, "B", m)
        needs.append(later if later in present else (c, s + 1, "I", m))
    return needs


def data_predecessors(action: Action, stages: int, present: dict[ActionKey, int]) -> list[Action]:
    """The compute actions ``action`` needs, among those ``present`` (keyed by ``action_key``)."""
    return [Action(s, ActionKind(kind), m, c) for c, s, kind, m in predecessor_keys(action_key(action), stages, present)]


def compute_actions(schedule: Schedule) -> list[Action]:
    return [a for _, _, a in schedule.actions() if a.is_compute]


@dataclass(frozen=True)
class Timing:
    """ASAP start and end of every action id of one order."""

    start: list[float]
    end: list[float]


def simulate_order(graph: Graph, order: Order, reuse: tuple[Timing, list[int]] | None = None) -> Timing | None:
    """ASAP timing of ``order``, or None when some rank can never finish.

    ``reuse = (timing, kept)`` resumes from an earlier run: on each rank r the
    first ``kept[r]`` actions are the same as then and keep their times. That
    is sound when the kept actions are closed under dependencies and program
    order, e.g. every action that started before some time t (nothing can
    depend on what starts later, since durations are positive).
    """
    n = len(graph.actions)
    start, end = [0.0] * n, [-1.0] * n
    pos, clock = [0] * len(order), [0.0] * len(order)
    if reuse is not None:
        _resume(order, reuse, start, end, pos, clock)
    duration, deps = graph.duration, graph.deps
    progress = True
    while progress:
        progress = False
        for r, seq in enumerate(order):
            p, t = pos[r], clock[r]
            while p < len(seq):
                a = seq[p]
                ready = t
                for d, latency in deps[a]:
                    e = end[d]
                    if e < 0.0:
                        ready = -1.0
                        break
                    if e + latency > ready:
                        ready = e + latency
                if ready < 0.0:
                    break
                start[a], t = ready, ready + duration[a]
                end[a] = t
                p += 1
            if p != pos[r]:
                pos[r], clock[r], progress = p, t, True
    if any(p < len(seq) for p, seq in zip(pos, order)):
        return None
    return Timing(start, end)


def _resume(order: Order, reuse: tuple[Timing, list[int]], start: list[float], end: list[float],
            pos: list[int], clock: list[float]) -> None:
    timing, kept = reuse
    for r, seq in enumerate(order):
        for a in seq[: kept[r]]:
            start[a], end[a] = timing.start[a], timing.end[a]
        pos[r] = kept[r]
        clock[r] = timing.end[seq[kept[r] - 1]] if kept[r] else 0.0


def peak_memory(graph: Graph, sequence: tuple[int, ...]) -> float:
    """The most a rank holds after any step, in program order (units of M_B)."""
    held = peak = 0.0
    for a in sequence:
        held += graph.delta[a]
        peak = max(peak, held)
    return peak


def evaluate(graph: Graph, order: Order, reuse: tuple[Timing, list[int]] | None = None) -> Evaluation | None:
    """The metrics of ``order``, or None when it deadlocks (``reuse``: see ``simulate_order``)."""
    timing = simulate_order(graph, order, reuse)
    return None if timing is None else metrics(graph, order, timing)


def metrics(graph: Graph, order: Order, timing: Timing) -> Evaluation:
    start, end = timing.start, timing.end
    spans, busy = [], []
    for seq in order:
        spans.append(end[seq[-1]] - start[seq[0]] if seq else 0.0)
        busy.append(sum(graph.duration[a] for a in seq))
    makespan = max(end, default=0.0)
    worst = max(spans, default=0.0)
    bubble = 1.0 - (sum(busy) / len(busy)) / worst if worst > 0 else 0.0
    peaks = tuple(peak_memory(graph, seq) for seq in order)
    return Evaluation(makespan, bubble, tuple(spans), tuple(busy), peaks, sum(end))


def is_complete(graph: Graph, order: Order) -> bool:
    """Every action exactly once, each on its own rank."""
    seen = [a for seq in order for a in seq]
    if sorted(seen) != list(range(len(graph.actions))):
        return False
    return all(graph.rank[a] == r for r, seq in enumerate(order) for a in seq)


def schedule_of(schedule: Schedule, graph: Graph, order: Order, name: str | None = None) -> Schedule:
    """The input schedule with its programs replaced by ``order`` (one compute action a step)."""
    programs = tuple(tuple(Step((graph.actions[a],)) for a in seq) for seq in order)
    problem = graph.problem
    memory = problem.memory if problem.memory_limit is not None else schedule.memory
    result = replace_programs(schedule, programs)
    return replace(result, name=name or result.name, costs=problem.costs, memory=memory, source=None)
