"""Placements the optimizer may choose (``--placement keep|loop|v|interleaved|any``).

``layouts(choice, problem)`` -> the ``Layout``s to try: each of the input's stages split into ``chunks``
consecutive stages placed ``loop`` or ``v`` (``keep``: the input's own; ``any``: every one that
applies). A k-chunk layout divides each stage's F, I, W, B and activation memory by k and keeps a
transfer's cost; memory limits stay in the input's units (k times the input's inside the layout).
``laid_out_schedule`` writes an order of a layout back as a schedule. What each choice means:
``docs/optimize.md`` (Placements).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from pipeforge.errors import Argument, ArgumentError, UsageError, words
from pipeforge.ir import CostModel, Placement, Schedule, Step
from pipeforge.optimizer.evaluate import Problem

PLACEMENTS = ("keep", "loop", "v", "interleaved", "any")


@dataclass(frozen=True)
class Layout:
    """How the input's stages are laid on the ranks: ``shape`` (keep, loop, v) and chunks per stage."""

    shape: str
    chunks: int = 1

    @property
    def keeps(self) -> bool:
        return self.shape == "keep"

    def placement(self, problem: Problem) -> Placement:
        stages = problem.stages * self.chunks
        if self.shape == "v":
            return Placement.v(stages, problem.ranks)
        return Placement.loop(stages, problem.ranks)

    def describe(self, problem: Problem) -> str:
        """E.g. ``v, 2 stages a rank``."""
        if self.keeps:
            return "keep (the input's)"
        per_rank = problem.stages * self.chunks // problem.ranks
        name = {"loop": "loop" if self.chunks == 1 else "interleaved", "v": "v"}[self.shape]
        return f"{name}, {per_rank} stage{'s' if per_rank != 1 else ''} a rank"

    def problem(self, base: Problem) -> Problem:
        """``base`` laid out this way: chunk costs, the placement, the limit in chunk units."""
        if self.keeps:
            return base
        limit = None if base.memory_limit is None else base.memory_limit * self.chunks
        k = self.chunks
        return replace(base, stages=base.stages * k, placements=(self.placement(base),),
                       costs=chunk_costs(base.costs, k), memory_limit=limit,
                       activation=tuple(a for a in base.activation for _ in range(k)),
                       weight_grad=tuple(g for g in base.weight_grad for _ in range(k)))


def layouts(choice: str, problem: Problem) -> list[Layout]:
    """The layouts ``--placement choice`` tries for ``problem`` (``keep`` first when tried)."""
    if choice not in PLACEMENTS:
        raise UsageError(f"unknown placement {choice!r}; expected one of {', '.join(PLACEMENTS)}")
    if choice == "keep":
        return [Layout("keep")]
    wanted = {"loop": [Layout("loop")], "v": [Layout("v", 2)], "interleaved": [Layout("loop", 2)],
              "any": [Layout("keep"), Layout("loop"), Layout("v", 2), Layout("loop", 2)]}[choice]
    if len(problem.placements) != 1:
        raise ArgumentError(Argument("placement", value=choice), words(
            f"the schedule has {len(problem.placements)} chains; only one chain can be laid out anew (use ",
            Argument("placement", value="keep"), ")"), value=choice)
    fitting = [layout for layout in wanted if layout.keeps or _fits(layout, problem)]
    unique = _without_repeats(fitting, problem)
    if len(unique) < len(fitting) and choice != "any":
        return [Layout("keep")]  # the input is already laid out this way
    if not any(not layout.keeps for layout in unique) and choice != "any":
        raise ArgumentError(Argument("placement", value=choice),
                            f"{problem.stages} stages cannot be laid {choice} on {problem.ranks} ranks "
                            "(needs a whole number of stages a rank)", value=choice)
    return unique


def _fits(layout: Layout, problem: Problem) -> bool:
    stages = problem.stages * layout.chunks
    return stages % problem.ranks == 0 and (layout.shape != "v" or (stages // problem.ranks) % 2 == 0)


def _without_repeats(found: list[Layout], problem: Problem) -> list[Layout]:
    """Drop a layout equal to the input's own (``keep`` already covers it)."""
    kept = []
    for layout in found:
        same_as_input = (not layout.keeps and layout.chunks == 1
                         and layout.placement(problem) == problem.placements[0])
        if not same_as_input:
            kept.append(layout)
    return kept


def common_chunks(found: list[Layout]) -> int:
    """A multiple of every layout's chunk count: integer costs times this divide exactly."""
    return math.lcm(*(layout.chunks for layout in found))


def chunk_costs(costs: CostModel, chunks: int) -> CostModel:
    """Each stage split in ``chunks``: stage s becomes stages s*k .. s*k+k-1, each 1/k of the compute;
    the link after stage s becomes the link after its last chunk, links between its chunks cost ``comm``."""
    per_stage = tuple((s * chunks + j, kind, value / chunks)
                      for s, kind, value in costs.per_stage for j in range(chunks))
    links = tuple(costs.links[s] if j == chunks - 1 else costs.comm   # a link inside a stage costs comm
                  for s in range(len(costs.links)) for j in range(chunks))
    return replace(costs, F=costs.F / chunks, I=costs.I / chunks, W=costs.W / chunks,
                   B=None if costs.B is None else costs.B / chunks, per_stage=per_stage, links=links)


def scale_costs(costs: CostModel, factor: float) -> CostModel:
    """Every duration and the latency times ``factor``."""
    return replace(costs, F=costs.F * factor, I=costs.I * factor, W=costs.W * factor, comm=costs.comm * factor,
                   B=None if costs.B is None else costs.B * factor,
                   per_stage=tuple((s, k, v * factor) for s, k, v in costs.per_stage),
                   links=tuple(v * factor for v in costs.links))


def laid_out_schedule(schedule: Schedule, problem: Problem, programs: tuple[tuple[Step, ...], ...],
                      costs: CostModel) -> Schedule:
    """``schedule`` with the layout's stages, placement, programs, chunk costs and limit (chunk units)."""
    memory = problem.memory
    return replace(schedule, stages=problem.stages, placements=problem.placements, programs=programs,
                   costs=costs, memory=memory, source=None, params=())
