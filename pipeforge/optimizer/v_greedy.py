"""The Zero Bubble paper's ZB-V scheduler: two chunks a rank in a V, built greedily with rank clocks.

Qi et al., "Zero Bubble Pipeline Parallelism" (arXiv 2401.10241, section on ZB-V),
as sail-sg/zero-bubble-pipeline-parallelism's ``zbv.py`` builds it. The
placement is ``Placement.v(2p, p)``: rank i holds stage i (the way down, "chunk
0") and stage 2p-1-i (the way back up, "chunk 1"); the loss is on rank 0.

- warm-up: one F of stage i on every rank; then, from the last rank up, each
  rank i runs its first F of the way back up, after as many more F of the way
  down (on ranks 0..i together) as fit in memory (``2 + 2i`` chunks ahead) and
  end before that F's input arrives; then the ranks below are topped up with F
  (alternating the chunks) until each has run as many as the rank above it;
- each of the ``2m`` rounds: every rank runs one I (the way-back chunk first
  once its gradient is there, ranks nearer the loss first), then one F (the
  way-up chunk as soon as its input is there, else the way-down one); before
  each, W fill the wait for the input and make room in memory; with
  ``fill_i`` / ``fill_f``, one more W goes into a wait that is large beside
  the worst bubble so far;
- the remaining W at the end.

The worst bubble of a run is fed back as every rank's allowance (``approved``)
and the run repeated while that helps, as the authors do; their four settings
of the two knobs are tried. All runs are returned; the caller keeps the best by
simulation. Times are in the exact integer units of ``units.py``.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, replace

from pipeforge.ir import ActionKind, Placement
from pipeforge.optimizer.evaluate import Problem
from pipeforge.semantics import ActionKey, memory_delta
from pipeforge.optimizer.units import integer_units

F, I, W = ActionKind.F.value, ActionKind.I.value, ActionKind.W.value
DOWN, UP = 0, 1        # a rank's chunk on the way down (stage i) and back up (stage 2p-1-i)
MAX_REPEATS = 8


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
    found = []
    for knobs in V_KNOBS:
        approved: list[float] | None = None
        for _ in range(MAX_REPEATS):
            if found and deadline is not None and time.monotonic() > deadline:
                return found
            builder = _VBuilder(exact, knobs, approved)
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


class _VBuilder:
    def __init__(self, problem: Problem, knobs: VKnobs, approved: list[float] | None):
        self.p, self.m, self.knobs = problem.ranks, problem.microbatches, knobs
        self.comm = problem.costs.comm
        self.stage_cost = {(k, s): problem.costs.duration(ActionKind(k), s) for k in (F, I, W)
                           for s in range(2 * self.p)}
        self.grow = {k: memory_delta(k, problem.weights) for k in (F, I, W)}  # semantics.MEMORY
        limit = problem.memory_limit
        self.limit = limit if limit is not None else 4.0 * self.p
        self.approved = approved or [-1.0] * self.p
        self.count = {(k, c, r): 0 for k in (F, I) for c in (DOWN, UP) for r in range(self.p)}
        self.end: dict[tuple[str, int, int, int], float] = {}
        self.clock = [0.0] * self.p
        self.held = [0.0] * self.p
        self.bubble = [0.0] * self.p
        self.pending_w: list[deque[tuple[int, int]]] = [deque() for _ in range(self.p)]
        self.programs: list[list[ActionKey]] = [[] for _ in range(self.p)]

    def stage(self, kind: str, chunk: int, r: int) -> int:
        """The global stage of rank r's chunk (an I of the way-down chunk belongs to stage r)."""
        return r if chunk == DOWN else 2 * self.p - 1 - r

    # -- the primitive -------------------------------------------------------

    def put(self, kind: str, chunk: int, r: int, mb: int | None = None) -> None:
        mb = self.count[(kind, chunk, r)] if mb is None else mb
        if mb >= self.m or self.held[r] + self.grow[kind] > self.limit + 1e-9:
            raise DoesNotFit
        stage = self.stage(kind, chunk, r)
        cost = self.stage_cost[(kind, stage)]
        no_wait = self.clock[r] + cost
        end = no_wait
        source = self.source(kind, chunk, r, mb)
        if source is not None:
            if source not in self.end:
                raise DoesNotFit
            end = max(end, self.end[source] + self.comm + cost)
        if self.count[(F, DOWN, r)] > 0:
            self.bubble[r] += end - no_wait
        self.end[(kind, chunk, r, mb)] = end
        self.clock[r] = end
        self.held[r] += self.grow[kind]
        self.programs[r].append((stage, ActionKind(kind), mb, 0))  # an Action's layout
        if kind == I:
            self.pending_w[r].append((chunk, mb))
        if kind != W:
            self.count[(kind, chunk, r)] += 1

    def source(self, kind: str, chunk: int, r: int, mb: int) -> tuple[str, int, int, int] | None:
        """The action on the neighbouring rank whose output this one waits for (None: same rank).

        F down waits for rank r-1; F up for rank r+1; the I of the way-up chunk (the loss side)
        for rank r-1; the I of the way-down chunk for rank r+1.
        """
        if kind == W:
            return None
        up_neighbour = (kind == F) == (chunk == UP)
        if up_neighbour:
            return (kind, chunk, r + 1, mb) if r + 1 < self.p else None
        return (kind, chunk, r - 1, mb) if r > 0 else None

    def put_w(self, r: int) -> None:
        chunk, mb = self.pending_w[r].popleft()
        self.put(W, chunk, r, mb)

    def ready(self, kind: str, chunk: int, r: int) -> float:
        """When the next such action's input arrives (-1 when it is local or not yet made)."""
        source = self.source(kind, chunk, r, self.count[(kind, chunk, r)])
        return self.end.get(source, -1.0) if source is not None else -1.0

    def worst_bubble(self, r: int) -> float:
        return max(max(self.bubble), max(self.approved) - self.approved[r])

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
        for r in range(self.p):
            self.put(F, DOWN, r)
        for r in reversed(range(self.p)):
            if r < self.p - 1:
                arrives = self.end[(F, UP, r + 1, 0)] + self.comm
                while (self.held[r] + 2 + 2 * r <= self.limit + 1e-9
                       and self.clock[r] + self.stage_cost[(F, r)] <= arrives
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
        for r in range(self.p):
            while self.held[r] + self.grow[I] > self.limit + 1e-9:
                self.make_room(r)
        first, then = [], []
        for r in range(self.p):
            if self.count[(I, DOWN, r)] >= self.count[(I, UP, r)]:
                then.append(r)      # the way-up chunk's I (the loss side) comes next
            elif r == self.p - 1 or self.ready(I, DOWN, r) >= 0 or self.count[(I, UP, r)] >= self.m:
                first.append(r)
            else:
                then.append(r)
        order = [(r, DOWN) for r in reversed(first)] + [(r, UP) for r in then]
        for r, chunk in order:
            self.fill(r, self.ready(I, chunk, r), chunk == DOWN or self.knobs.fill_i)
            self.put(I, chunk, r)

    def forward_round(self) -> None:
        for r in range(self.p):
            chunk = self.next_forward(r)
            if chunk is None:
                continue
            while self.held[r] + 1.0 > self.limit + 1e-9:
                self.make_room(r)
            self.fill(r, self.ready(F, chunk, r), self.knobs.fill_f)
            self.put(F, chunk, r)

    def next_forward(self, r: int) -> int | None:
        if self.count[(F, UP, r)] >= self.m:
            return None
        if self.count[(F, UP, r)] >= self.count[(F, DOWN, r)]:
            return DOWN
        if r == self.p - 1 or self.ready(F, UP, r) >= 0:
            return UP
        if self.count[(F, DOWN, r)] < self.m and (r == 0 or self.ready(F, DOWN, r) >= 0):
            return DOWN
        return None

    def make_room(self, r: int) -> None:
        if not self.pending_w[r]:
            raise DoesNotFit
        self.put_w(r)

    def fill(self, r: int, ready: float, fill_large_gap: bool) -> None:
        """W into the wait for an input arriving at ``ready`` (-1: nothing to wait for)."""
        if ready >= 0:
            while self.pending_w[r] and ready + self.comm >= self.clock[r] + self.w_cost(r):
                self.put_w(r)
        gap = ready + self.comm - self.clock[r]
        if self.pending_w[r] and gap > self.worst_bubble(r) - self.bubble[r] and fill_large_gap:
            self.put_w(r)

    def w_cost(self, r: int) -> float:
        chunk, _ = self.pending_w[r][0]
        return self.stage_cost[(W, self.stage(W, chunk, r))]
