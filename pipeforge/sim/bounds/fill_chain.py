"""The fill chain: a bound on the worst span of every schedule of the work, over all ranks together.

For one chain with one stage a rank: ``fill_chain_span(graph, limit, busy)`` is the least, over every
choice of how many forwards each rank runs before its first backward, of the worst ``busy + idle`` that
choice leaves (space 2 of ``pipeforge.sim.bounds``; 0 where it does not apply).
``fill_chain_forwards(shape, costs, memory, limit)`` gives that least choice where it forces idle: the
warm-up the Zero Bubble builder (``optimizer/greedy.py``) follows. The proof and how it is computed:
``docs/bounds.md`` (The fill chain).
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass

from pipeforge.ir import ActionKind
from pipeforge.semantics import stage_effect
from pipeforge.sim.workgraph import WorkGraph

_F, _B, _I, _W = ActionKind.F, ActionKind.B, ActionKind.I, ActionKind.W
TOLERANCE = 1e-9   # as work.py: how far a count of F may be from the next integer and still be it
STRICT = 1e-12     # relative: "strictly less" than a worst span (scaled by it, so unit-free)
MAX_ROUNDS = 10000  # each round lowers the target; a finite number of choices, this is a safety cap


@dataclass(frozen=True)
class _Stage:
    """What the chain needs of one stage: its F, its least backward, the latency to the next stage
    (``down``) and back (``up``), how many F fit before its first backward, and its rank's busy time."""

    forward: float
    backward: float
    down: float
    up: float
    fits: int
    busy: float

    def idle(self, window: float) -> float:
        """The least idle before a first backward that starts ``window`` after the rank's start."""
        return max(0.0, window - self.count(window) * self.forward)

    def count(self, window: float) -> int:
        """How many F the rank runs in ``window`` (as many as fit)."""
        return min(self.fits, math.floor(window / self.forward + TOLERANCE))

    def next_full(self, window: float) -> float | None:
        """The smallest window at or after ``window`` the rank fills with F (None: the limit forbids it)."""
        count = math.floor(window / self.forward + TOLERANCE)
        if window - count * self.forward <= TOLERANCE * self.forward:
            return window if count <= self.fits else None
        return (count + 1) * self.forward if count + 1 <= self.fits else None


def least_stage_work(costs, stage: int) -> float:
    """One microbatch's least compute on ``stage``: F and the cheaper of B or I + W (what ``busy`` counts)."""
    return costs.duration(_F, stage) + min(costs.duration(_B, stage),
                                           costs.duration(_I, stage) + costs.duration(_W, stage))


@dataclass(frozen=True)
class Choice:
    """The least worst span over the fill chain's choices (``span``) and, per stage, how many F its rank
    runs before its first backward in the choice that gives it (``forwards``)."""

    span: float
    forwards: tuple[int, ...]


def fill_chain_span(graph: WorkGraph, limit: float | None, busy: list[float]) -> float:
    """The fill chain's bound on the worst span (0 where it says nothing: several chains, a rank with
    several stages or none, a microbatch without its F or backward on some stage)."""
    microbatches = _complete_microbatches(graph)
    if microbatches is None:
        return 0.0
    stages = _stages(graph.shape, graph.costs, graph.memory, limit, busy, microbatches)
    choice = None if stages is None else _least(stages)
    return 0.0 if choice is None else choice.span


def fill_chain_forwards(shape, costs, memory, limit: float | None) -> tuple[int, ...] | None:
    """For the whole work of ``shape`` (every stage runs F and a backward of each microbatch): how many F
    each stage's rank runs before its first backward in the least choice, where that choice leaves some
    rank idle (None where no idle is forced or the chain does not apply). A schedule that wants to meet
    the bound can start this way (``optimizer.greedy``)."""
    busy = [0.0] * shape.ranks
    for s in range(shape.stages):
        busy[shape.placements[0].stage_to_rank[s]] += shape.microbatches * least_stage_work(costs, s)
    stages = _stages(shape, costs, memory, limit, busy, shape.microbatches)
    choice = None if stages is None else _least(stages)
    if choice is None or choice.span <= max(busy) * (1.0 + STRICT):
        return None
    return choice.forwards


def _least(stages: list[_Stage]) -> Choice | None:
    """The least worst span over the choices (None where nothing is proved; see the module doc)."""
    if any(stage.fits < 1 for stage in stages):
        return None  # (no F fits: no schedule runs, nothing to bound)
    found = _choose(stages, math.inf)
    for _ in range(MAX_ROUNDS):
        if found is None:
            return None  # (cannot happen: with no cap on idle every choice is admissible)
        lower = _choose(stages, found.span * (1.0 - STRICT))
        if lower is None:
            return found
        found = lower
    return None  # nothing proved within the cap: say nothing rather than something unproved


def _choose(stages: list[_Stage], target: float) -> Choice | None:
    """The smallest admissible choices when every rank may idle while its ``busy + idle`` stays within
    ``target``, and the worst span they need (None: no choice meets the target)."""
    needed, returns, forwards = 0.0, None, []  # returns: from the next stage's start to its first backward's end
    for stage in reversed(stages):
        if stage.busy > target:
            return None
        window = stage.forward if returns is None else stage.forward + stage.down + returns + stage.up
        if stage.busy + stage.idle(window) > target:
            full = stage.next_full(window)
            if full is None:
                return None
            window = full
        needed = max(needed, stage.busy + stage.idle(window))
        forwards.append(stage.count(window))
        returns = window + stage.backward
    return Choice(needed, tuple(reversed(forwards)))


def _stages(shape, costs, memory, limit: float | None, busy: list[float], microbatches: int) -> list[_Stage] | None:
    """Each stage's numbers, first stage first (None where the argument does not apply)."""
    if len(shape.placements) != 1 or shape.stages != shape.ranks or shape.stages < 1 or microbatches < 1:
        return None
    to_rank = shape.placements[0].stage_to_rank
    if sorted(to_rank) != list(range(shape.ranks)):
        return None
    found = []
    for s in range(shape.stages):
        forward = costs.duration(_F, s)
        backward = min(costs.duration(_I, s), costs.duration(_B, s))
        if forward <= 0 or backward < 0:
            return None
        activation = stage_effect(memory, _F, s)[0]
        fits = microbatches if limit is None or activation <= 0 else min(
            microbatches, math.floor(limit / activation + TOLERANCE))
        down = costs.latency(s, s + 1) if s + 1 < shape.stages else 0.0
        up = costs.latency(s + 1, s) if s + 1 < shape.stages else 0.0
        found.append(_Stage(forward, backward, down, up, fits, busy[to_rank[s]]))
    return found


def _complete_microbatches(graph: WorkGraph) -> int | None:
    """m, when every stage runs exactly one F and one backward (I or B) of each of microbatches 0..m-1."""
    stages = graph.shape.stages
    lanes = Counter((a.stage, a.kind, a.microbatch) for a in graph.actions if a.kind in (_F, _I, _B))
    microbatches = {a.microbatch for a in graph.actions}
    if None in microbatches or any(a.chain != 0 for a in graph.actions):
        return None
    m = len(microbatches)
    if microbatches != set(range(m)):
        return None
    for s in range(stages):
        for mb in range(m):
            if lanes[(s, _F, mb)] != 1 or lanes[(s, _I, mb)] + lanes[(s, _B, mb)] != 1:
                return None
    return m
