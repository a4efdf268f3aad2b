"""The Zero Bubble paper's ZB-V scheduler: two chunks a rank in a V, built greedily with rank clocks.

``zero_bubble_v_orders(problem, deadline)`` -> every run of the authors' four settings (``V_KNOBS``),
each repeated with its worst bubble fed back while that helps; the caller keeps the best by simulation.
``supports(problem)``: ``Placement.v(2p, p)``, one chain. Times are in the exact integer units of
``units.py``. The algorithm: ``docs/optimize.md`` (The ZB-V builder).
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, replace

from pipeforge.ir import ActionKind, Placement
from pipeforge.optimizer.evaluate import Problem, stage_growth
from pipeforge.optimizer.units import integer_units
from pipeforge.semantics import SPLIT_WORK_TEXTS, ActionKey, needs

F, I, W = ActionKind.F.value, ActionKind.I.value, ActionKind.W.value  # noqa: E741
DOWN, UP = 0, 1        # a rank's chunk on the way down (stage i) and back up (stage 2p-1-i)
MAX_REPEATS = 8
TOLERANCE = 1e-9


class DoesNotFit(Exception):
    """This setting cannot keep within the memory limit."""


@dataclass(frozen=True)
class VKnobs:
    fill_i: bool
    fill_f: bool


V_KNOBS = tuple(VKnobs(b, f) for b in (True, False) for f in (True, False))


def supports(problem: Problem) -> bool:
    """One chain, two stages a rank in a V, and room for a chunk's forward on each rank."""
    p = problem.ranks
    return (len(problem.placements) == 1 and problem.stages == 2 * p and p >= 1
            and problem.placements[0] == Placement.v(2 * p, p)
            and (problem.memory_limit is None or problem.memory_limit >= 2.0))


def zero_bubble_v_orders(problem: Problem, deadline: float | None = None
                         ) -> list[tuple[VKnobs, tuple[tuple[ActionKey, ...], ...]]]:
    """The orders of every setting (and of every repeat with the allowance fed back) that fit;
    past ``deadline`` (``time.monotonic()``) no further run is started once one order is found."""
    exact = replace(problem, costs=integer_units(problem.costs).costs)
    shape = _VShape(exact)
    found: list[tuple[VKnobs, tuple[tuple[ActionKey, ...], ...]]] = []
    for knobs in V_KNOBS:
        approved: list[float] | None = None
        for _ in range(MAX_REPEATS):
            if found and deadline is not None and time.monotonic() > deadline:
                return found
            builder = _VBuilder(shape, knobs, approved)
            try:
                keys = builder.build()
            except DoesNotFit:
                break
            found.append((knobs, keys))
            worst = max(builder.bubble)
            if approved is not None and worst >= max(approved):
                break
            approved = list(builder.bubble)
    return found


class _VShape:
    """What every run shares: each (kind, chunk, rank)'s stage, duration, memory growth and the
    cross-rank input it waits for (``semantics.needs``, with its link's ``CostModel.latency``)."""

    def __init__(self, problem: Problem):
        self.p, self.m = problem.ranks, problem.microbatches
        stages, owner = 2 * self.p, problem.placements[0].stage_to_rank
        growth = stage_growth(problem)  # per kind, per stage (M_B): semantics.MEMORY at the stage's sizes
        self.stage = [[r if chunk == DOWN else stages - 1 - r for r in range(self.p)] for chunk in (DOWN, UP)]
        self.cost, self.grow, self.source = {}, {}, {}
        for kind in SPLIT_WORK_TEXTS:
            for chunk in (DOWN, UP):
                for r in range(self.p):
                    stage = self.stage[chunk][r]
                    self.cost[kind, chunk, r] = problem.costs.duration(ActionKind(kind), stage)
                    self.grow[kind, chunk, r] = growth[kind][stage]
                    self.source[kind, chunk, r] = _cross_rank_input(kind, stage, stages, owner, problem.costs)
        limit = problem.memory_limit
        self.limit = (limit if limit is not None else 4.0 * self.p) + TOLERANCE


def _cross_rank_input(kind: str, stage: int, stages: int, owner: tuple[int, ...], costs
                      ) -> tuple[tuple[int, str], float] | None:
    """The (stage, kind) on another rank whose output ``kind`` on ``stage`` waits for, and the link's
    latency; None when every input is on the same rank (put earlier by construction). Of B or I
    the builder runs the I."""
    for producers, send, _ in needs((stage, kind, 0, 0), stages):
        if send is not None and owner[producers[0][0]] != owner[stage]:
            made_by = next((s, k._value_) for s, k, _, _ in producers if k in SPLIT_WORK_TEXTS)
            return made_by, costs.latency(made_by[0], stage)
    return None


class _VBuilder:
    """One run: clocks, counts, memory and bubbles per rank. Each stage runs each kind in microbatch
    order, so ends are kept per (stage, kind) at the microbatch's index."""

    def __init__(self, shape: _VShape, knobs: VKnobs, approved: list[float] | None):
        self.shape, self.knobs = shape, knobs
        self.p, self.m = shape.p, shape.m
        self.approved = approved or [-1.0] * self.p
        self.most_approved = max(self.approved)
        self.count = {(k, c, r): 0 for k in (F, I) for c in (DOWN, UP) for r in range(self.p)}
        self.ends: dict[tuple[int, str], list[float]] = {(s, k): [] for s in range(2 * self.p)
                                                         for k in SPLIT_WORK_TEXTS}
        # per kind, chunk and rank: (stage, duration, memory growth, its ends, its input's ends or None, latency)
        self.slot = {kind: [[self._slot(kind, chunk, r) for r in range(self.p)] for chunk in (DOWN, UP)]
                     for kind in SPLIT_WORK_TEXTS}
        self.down_forwards = [self.ends[(r, F)] for r in range(self.p)]  # a rank's bubble counts after its first
        self.clock = [0.0] * self.p
        self.held = [0.0] * self.p
        self.bubble = [0.0] * self.p
        self.worst = 0.0  # max(self.bubble): bubbles only grow
        self.pending_w: list[deque[tuple[int, int]]] = [deque() for _ in range(self.p)]
        self.programs: list[list[ActionKey]] = [[] for _ in range(self.p)]

    def _slot(self, kind: str, chunk: int, r: int) -> tuple:
        shape = self.shape
        stage, source = shape.stage[chunk][r], shape.source[kind, chunk, r]
        made, latency = (None, 0.0) if source is None else (self.ends[source[0]], source[1])
        return stage, shape.cost[kind, chunk, r], shape.grow[kind, chunk, r], self.ends[(stage, kind)], made, latency

    # -- the primitive -------------------------------------------------------

    def put(self, kind: str, chunk: int, r: int, mb: int | None = None) -> None:
        stage, cost, grow, ends, made, latency = self.slot[kind][chunk][r]
        mb = self.count[(kind, chunk, r)] if mb is None else mb
        held = self.held[r] + grow
        if mb >= self.m or held > self.shape.limit:
            raise DoesNotFit
        clock = start = self.clock[r]
        if made is not None:
            if mb >= len(made):
                raise DoesNotFit
            if made[mb] + latency > start:
                start = made[mb] + latency
        if self.down_forwards[r]:
            bubble = self.bubble[r] = self.bubble[r] + start - clock
            if bubble > self.worst:
                self.worst = bubble
        end = self.clock[r] = start + cost
        ends.append(end)
        self.held[r] = held
        self.programs[r].append((stage, kind, mb, 0))  # an Action's layout, the kind as its letter
        if kind == I:
            self.pending_w[r].append((chunk, mb))
        if kind != W:
            self.count[(kind, chunk, r)] += 1

    def put_w(self, r: int) -> None:
        chunk, mb = self.pending_w[r].popleft()
        self.put(W, chunk, r, mb)

    def arrival(self, kind: str, chunk: int, r: int) -> float | None:
        """When the next such action's cross-rank input arrives (None: it has none, or it is not made)."""
        made, latency = self.slot[kind][chunk][r][4:]
        if made is None:
            return None
        mb = self.count[(kind, chunk, r)]
        return made[mb] + latency if mb < len(made) else None

    def made(self, kind: str, chunk: int, r: int) -> bool:
        return self.arrival(kind, chunk, r) is not None

    def worst_bubble(self, r: int) -> float:
        return max(self.worst, self.most_approved - self.approved[r])

    # -- the schedule ----------------------------------------------------------

    def build(self) -> tuple[tuple[ActionKey, ...], ...]:
        self.warm_up()
        self.top_up()
        for _ in range(2 * self.m):
            self.backward_round()
            self.forward_round()
        for r in range(self.p):
            while self.pending_w[r]:
                self.put_w(r)
        if any(len(program) != 6 * self.m for program in self.programs):
            raise DoesNotFit
        return tuple(tuple(program) for program in self.programs)

    def warm_up(self) -> None:
        shape = self.shape
        for r in range(self.p):
            self.put(F, DOWN, r)
        for r in reversed(range(self.p)):
            if r < self.p - 1:
                arrives = self.arrival(F, UP, r)
                assert arrives is not None, "rank r + 1's first F of the chunk is put before rank r's"
                ahead = shape.grow[F, DOWN, r] * (2 + 2 * r)  # room for 2 + 2r more chunk forwards
                while (self.held[r] + ahead <= shape.limit
                       and self.clock[r] + shape.cost[F, DOWN, r] <= arrives
                       and self.count[(F, DOWN, r)] < self.m):
                    for j in range(r + 1):
                        self.put(F, DOWN, j)
            self.put(F, UP, r)

    def top_up(self) -> None:
        chunk = DOWN
        for r in range(1, self.p):
            while self.behind(r):
                for j in range(self.p - 1, r - 1, -1):
                    if self.count[(F, chunk, j)] < self.m:
                        self.put(F, chunk, j)
                chunk = 1 - chunk

    def behind(self, r: int) -> bool:
        mine = self.count[(F, DOWN, r)] + self.count[(F, UP, r)]
        above = self.count[(F, DOWN, r - 1)] + self.count[(F, UP, r - 1)]
        return mine < above or self.count[(F, UP, r)] <= self.count[(F, UP, r - 1)] < self.m

    def backward_round(self) -> None:
        shape = self.shape
        for r in range(self.p):
            while self.held[r] + max(shape.grow[I, DOWN, r], shape.grow[I, UP, r]) > shape.limit:
                self.make_room(r)
        first, then = [], []
        for r in range(self.p):
            if self.count[(I, DOWN, r)] >= self.count[(I, UP, r)]:
                then.append(r)      # the way-up chunk's I (the loss side) comes next
            elif r == self.p - 1 or self.made(I, DOWN, r) or self.count[(I, UP, r)] >= self.m:
                first.append(r)
            else:
                then.append(r)
        order = [(r, DOWN) for r in reversed(first)] + [(r, UP) for r in then]
        for r, chunk in order:
            self.fill(r, self.arrival(I, chunk, r), chunk == DOWN or self.knobs.fill_i)
            self.put(I, chunk, r)

    def forward_round(self) -> None:
        for r in range(self.p):
            chunk = self.next_forward(r)
            if chunk is None:
                continue
            while self.held[r] + self.shape.grow[F, chunk, r] > self.shape.limit:
                self.make_room(r)
            self.fill(r, self.arrival(F, chunk, r), self.knobs.fill_f)
            self.put(F, chunk, r)

    def next_forward(self, r: int) -> int | None:
        if self.count[(F, UP, r)] >= self.m:
            return None
        if self.count[(F, UP, r)] >= self.count[(F, DOWN, r)]:
            return DOWN
        if r == self.p - 1 or self.made(F, UP, r):
            return UP
        if self.count[(F, DOWN, r)] < self.m and (r == 0 or self.made(F, DOWN, r)):
            return DOWN
        return None

    def make_room(self, r: int) -> None:
        if not self.pending_w[r]:
            raise DoesNotFit
        self.put_w(r)

    def fill(self, r: int, arrives: float | None, fill_large_gap: bool) -> None:
        """W into the wait for an input arriving at ``arrives`` (None: nothing to wait for); then one
        more when the rest of the wait is large beside the worst bubble (and ``fill_large_gap``)."""
        if arrives is None:
            return
        while self.pending_w[r] and arrives >= self.clock[r] + self.w_cost(r):
            self.put_w(r)
        gap = arrives - self.clock[r]
        if self.pending_w[r] and gap > self.worst_bubble(r) - self.bubble[r] and fill_large_gap:
            self.put_w(r)

    def w_cost(self, r: int) -> float:
        chunk, _ = self.pending_w[r][0]
        return self.shape.cost[W, chunk, r]
