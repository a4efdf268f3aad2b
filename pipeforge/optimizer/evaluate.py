"""What the optimizers share: the problem, the work graph of its actions, and the metrics of an order.

The search strategies try thousands of candidate orders of one set of compute
actions. The actions are compiled once into a ``WorkGraph``
(``pipeforge.sim.workgraph``: integer ids, ranks, durations, memory effects,
dependencies with latency) and every order is timed by the same engine as
``pipeforge.sim.simulate``, ``time_order``: as soon as possible in program
order. An *order* is, per rank, the tuple of ids that rank runs, one action a
step. Metrics follow DESIGN.md (the Zero Bubble paper's bubble rate:
``1 - mean(busy) / max(span)``). An order that cannot run to the end (a rank
waits forever) evaluates to ``None``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from pipeforge.ir import Action, ActionKind, CostModel, MemorySpec, Placement, Schedule, Step, replace_programs
from pipeforge.semantics import SPLIT_WORK_TEXTS, bubble_rate, stage_effect, within_limit
from pipeforge.sim.workgraph import Order, Shape, Times, WorkGraph, canonical, peak_memory, time_order

TOLERANCE = 1e-9

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
    checkpoint: float = 0.0  # M_B, what a recomputed F keeps (MemorySpec.checkpoint)
    checkpoints: tuple[float, ...] = ()  # per stage (MemorySpec.checkpoints)

    @staticmethod
    def of(schedule: Schedule, costs: CostModel | None = None, memory_limit: float | None = None) -> Problem:
        memory = schedule.memory or MemorySpec()
        limit = memory_limit if memory_limit is not None else memory.limit
        return Problem(
            ranks=schedule.ranks, stages=schedule.stages, microbatches=schedule.microbatches,
            placements=schedule.placements, costs=costs or schedule.costs or CostModel(),
            memory_limit=limit, weights=memory.weights, activation=memory.activation,
            weight_grad=memory.weight_grad, checkpoint=memory.checkpoint, checkpoints=memory.checkpoints,
        )

    def rank_of(self, action: Action) -> int:
        return self.placements[action.chain].rank_of(action.stage)

    def duration(self, action: Action) -> float:
        return self.costs.duration(action.kind, action.stage)

    @property
    def memory(self) -> MemorySpec:
        """The memory rule as a spec (limit, weights, per-stage activation and weight-gradient sizes)."""
        return MemorySpec(self.memory_limit, self.weights, activation=self.activation, weight_grad=self.weight_grad,
                          checkpoint=self.checkpoint, checkpoints=self.checkpoints)

    @property
    def shape(self) -> Shape:
        return Shape(self.ranks, self.stages, self.microbatches, self.placements)


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
        return within_limit(max(self.peak_memory, default=0.0), limit)


def stage_growth(problem: Problem) -> dict[str, list[float]]:
    """What one F, I or W changes its rank's held activations by, per kind (its letter) and stage (M_B):
    what the greedy and list schedulers count memory with, as the graph does."""
    memory = problem.memory
    return {kind: [added - released for added, released in (stage_effect(memory, ActionKind(kind), s)
                                                             for s in range(problem.stages))]
            for kind in SPLIT_WORK_TEXTS}


class Graph(WorkGraph):
    """The work graph of a problem's actions (ids sorted by chain, stage, kind, microbatch)."""

    def __init__(self, problem: Problem, actions: list[Action]):
        super().__init__(problem.shape, canonical(actions), problem.costs, problem.memory)
        self.problem = problem


def compute_actions(schedule: Schedule) -> list[Action]:
    return [a for _, _, a in schedule.actions() if a.is_compute]


def simulate_order(graph: Graph, order: Order, reuse: tuple[Times, list[int]] | None = None) -> Times | None:
    """The engine's times of ``order`` (``time_order``; ``reuse`` is its ``resume``), or None when some
    rank can never finish."""
    times = time_order(graph, order, reuse)
    return times if times.finished(order) else None


def evaluate(graph: Graph, order: Order, reuse: tuple[Times, list[int]] | None = None) -> Evaluation | None:
    """The metrics of ``order``, or None when it deadlocks (``reuse``: see ``simulate_order``)."""
    timing = simulate_order(graph, order, reuse)
    return None if timing is None else metrics(graph, order, timing)


def metrics(graph: Graph, order: Order, timing: Times, changed: tuple[Evaluation, int] | None = None) -> Evaluation:
    """The figures of a finished ``timing`` of ``order``, over the nodes the order runs (a mix of the fuse
    search, ``mixed.py``, leaves some nodes of its graph out). ``changed = (evaluation, r)``: ``order``
    differs from the one ``evaluation`` measured on rank ``r`` only (same graph but for that rank's
    nodes), so the other ranks' busy time and peak memory are taken from it."""
    start, end, duration = timing.start, timing.end, graph.duration
    spans, total_end, makespan = [], 0.0, 0.0
    for seq in order:
        spans.append(end[seq[-1]] - start[seq[0]] if seq else 0.0)
        total_end += sum(map(end.__getitem__, seq))
        makespan = max(makespan, end[seq[-1]] if seq else 0.0)
    if changed is None:
        busy = tuple(sum(map(duration.__getitem__, seq)) for seq in order)
        peaks = tuple(peak_memory(graph, seq) for seq in order)
    else:
        base, r = changed
        busy = base.busy[:r] + (sum(map(duration.__getitem__, order[r])),) + base.busy[r + 1:]
        peaks = base.peak_memory[:r] + (peak_memory(graph, order[r]),) + base.peak_memory[r + 1:]
    worst = max(spans, default=0.0)
    bubble = bubble_rate(sum(busy) / len(busy) if busy else 0.0, worst)
    return Evaluation(makespan, bubble, tuple(spans), busy, peaks, total_end)


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
