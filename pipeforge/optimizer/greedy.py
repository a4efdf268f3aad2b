"""The Zero Bubble paper's automatic scheduler (ZB-1p / ZB-2p), one stage per rank.

``zero_bubble_orders(problem)`` -> one ``GreedyOrder`` per setting of the paper's three knobs
(``KNOB_SETTINGS``) and, where the fill chain proves some rank must idle, of ``FILL_SETTINGS``, each
built one microbatch round at a time with every rank's clock; ``best_zero_bubble_order`` keeps the one
with the least worst span. ``supports(problem)``: one chain, one stage a rank in loop order. On the
paper's Table 5 rows it builds the authors' very orders. The algorithm: ``docs/optimize.md`` (The Zero
Bubble builder).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import cached_property

from pipeforge.ir import Action, ActionKind, as_action
from pipeforge.optimizer.evaluate import TOLERANCE, Problem, stage_growth
from pipeforge.optimizer.units import integer_units
from pipeforge.semantics import SPLIT_WORK_TEXTS, ActionKey, needs
from pipeforge.sim.bounds import fill_chain_forwards

# Kinds as their letters: the builder keys its tables by kind in its hot loop, and an exact str hashes
# fastest there. A key (stage, "F", microbatch, 0) is equal to the Action it names (semantics.ActionKey).
F, I, W = ActionKind.F.value, ActionKind.I.value, ActionKind.W.value  # noqa: E741
Kind = str


@dataclass(frozen=True)
class Knobs:
    bubble_before_first_i: bool
    prioritize_i: bool
    fill_small_gaps: bool
    fill_chain_warm_up: bool = False  # warm up as the fill chain's least choice says (FILL_SETTINGS)


KNOB_SETTINGS = tuple(
    Knobs(a, b, c) for a in (True, False) for b in (True, False) for c in (True, False)
)
FILL_SETTINGS = tuple(Knobs(True, b, c, fill_chain_warm_up=True) for b in (True, False) for c in (True, False))
# The order they are built in when the search may stop at a bound: the settings that win most often on
# the Zero Bubble paper's rows first (every 1p and 1.375p row: the first; every 2p row: the fill chain's
# first). Without a stop every setting runs and ties go to the first in KNOB_SETTINGS, as the paper's
# code does (the fill chain's settings come after the paper's).
TRY_FIRST = (Knobs(True, True, False), Knobs(True, True, True))
BUILD_ORDER = TRY_FIRST + FILL_SETTINGS + tuple(k for k in KNOB_SETTINGS if k not in TRY_FIRST)


class DoesNotFit(Exception):
    """This knob setting cannot respect the memory limit."""


def supports(problem: Problem) -> bool:
    """The heuristic needs one chain and one stage a rank in loop order (stage s on rank s)."""
    return (
        len(problem.placements) == 1
        and problem.stages == problem.ranks
        and problem.placements[0].stage_to_rank == tuple(range(problem.ranks))
        and (problem.memory_limit is None or problem.memory_limit >= 1.0)
    )


@dataclass(frozen=True)
class GreedyOrder:
    """One knob setting's per-rank order and the spans its own clocks give (ASAP, as ``evaluate``).

    ``kinds`` is each rank's program as kind letters (every stage runs each kind in microbatch order,
    so the letters name the actions); ``keys`` the same as action keys. ``ticks`` are the spans in the
    exact integer units the builder works in (``units.py``), ``spans`` the same in the problem's units.
    """

    knobs: Knobs
    kinds: tuple[str, ...]
    spans: tuple[float, ...]
    ticks: tuple[float, ...]

    @cached_property
    def keys(self) -> tuple[tuple[ActionKey, ...], ...]:
        found = []
        for j, letters in enumerate(self.kinds):
            seen = {F: 0, I: 0, W: 0}
            program = []
            for kind in letters:
                program.append((j, kind, seen[kind], 0))
                seen[kind] += 1
            found.append(tuple(program))
        return tuple(found)

    @property
    def programs(self) -> tuple[tuple[Action, ...], ...]:
        return tuple(tuple(as_action(key) for key in rank) for rank in self.keys)

    def key(self) -> tuple[float, float]:
        """Worst span, then total span, compared exactly (in integer units)."""
        return (max(self.ticks), sum(self.ticks))


def zero_bubble_orders(problem: Problem, stop_at: float | None = None) -> list[GreedyOrder]:
    """The orders of every knob setting that fits in memory (the same orders whatever the cost units):
    the paper's, and ``FILL_SETTINGS`` where the fill chain forces idle; with ``stop_at`` (a worst span
    in the problem's units, e.g. a proven lower bound) the settings are built in ``BUILD_ORDER`` and the
    building stops at the first order whose worst span reaches it."""
    units = integer_units(problem.costs)
    exact = replace(problem, costs=units.costs)
    forwards = fill_chain_forwards(exact.shape, exact.costs, exact.memory, exact.memory_limit)
    found = []
    for knobs in KNOB_SETTINGS + FILL_SETTINGS if stop_at is None else BUILD_ORDER:
        if knobs.fill_chain_warm_up and forwards is None:
            continue
        builder = _RoundBuilder(exact, knobs, forwards)
        try:
            kinds = builder.build()
        except DoesNotFit:
            continue
        ticks = tuple(end - first for end, first in zip(builder.clock, builder.first_start))
        found.append(GreedyOrder(knobs, kinds, tuple(map(units.to_real, ticks)), ticks))
        if stop_at is not None and max(found[-1].spans) <= stop_at * (1 + TOLERANCE) + TOLERANCE:
            break
    return found


def best_zero_bubble_order(problem: Problem, stop_at: float | None = None) -> GreedyOrder | None:
    """The paper's choice: the setting with the smallest worst span (then total span; ties to the first
    setting in ``KNOB_SETTINGS``); ``stop_at``: see ``zero_bubble_orders``."""
    rank = {knobs: i for i, knobs in enumerate(KNOB_SETTINGS + FILL_SETTINGS)}
    return min(zero_bubble_orders(problem, stop_at), key=lambda o: (o.key(), rank[o.knobs]), default=None)


def input_pattern(kind: Kind, stage: int, stages: int, costs) -> tuple[tuple[int, Kind, float], ...]:
    """What ``kind`` on ``stage`` needs from the neighbouring stages (``semantics.needs``, the same for
    every microbatch), as (stage, kind, latency) of the producer the builder runs (it runs F, I and W:
    of B or I, the I). Such an edge is between ranks here (one stage a rank) and takes its link's
    latency (``CostModel.latency``). An input of
    the same stage (F before its I, I before its W) is on this rank and put earlier by construction,
    so it never delays a start: left out (the search re-times and verifies every order anyway)."""
    found = []
    for producers, send, _ in needs((stage, kind, 0, 0), stages):
        if send is not None:
            found.append(next((p[0], p[1]._value_, costs.latency(p[0], stage)) for p in producers
                              if p[1] in SPLIT_WORK_TEXTS))
    return tuple(found)


class _RoundBuilder:
    """The state of one run of the heuristic: per rank clock, counts, memory and bubble.

    Every stage runs each kind in microbatch order, so an action's end is kept in ``ends[kind][stage]``
    at its microbatch's index, and a rank's program as kind letters."""

    def __init__(self, problem: Problem, knobs: Knobs, forwards: tuple[int, ...] | None = None):
        self.knobs = knobs
        self.forwards = forwards  # per stage, F before the first I (the fill chain's; FILL_SETTINGS)
        self.p, self.m = problem.stages, problem.microbatches
        self.cost = {k: [problem.costs.duration(ActionKind(k), s) for s in range(self.p)] for k in SPLIT_WORK_TEXTS}
        self.grow = stage_growth(problem)  # per kind, per stage (M_B): semantics.MEMORY at the stage's sizes
        # what an I adds where it holds more until its W than its F left (weight_grad > activation): an F
        # leaves room for it, or the I after it could not run
        self.i_excess = [max(grow, 0.0) for grow in self.grow[I]]
        limit = problem.memory_limit
        self.limit = (limit if limit is not None else float(self.m) + 1.0) + TOLERANCE
        self.done = {k: [0] * self.p for k in SPLIT_WORK_TEXTS}
        self.held = [0.0] * self.p
        self.clock = [0.0] * self.p
        self.first_start = [0.0] * self.p
        self.bubble = [0.0] * self.p
        self.worst = 0.0  # max(self.bubble): bubbles only grow
        self.inputs = {k: [input_pattern(k, j, self.p, problem.costs) for j in range(self.p)] for k in SPLIT_WORK_TEXTS}
        self.link = [problem.costs.latency(s, s + 1) for s in range(self.p - 1)]  # stage s <-> s + 1
        self.ends: dict[Kind, list[list[float]]] = {k: [[] for _ in range(self.p)] for k in SPLIT_WORK_TEXTS}
        self.programs: list[list[Kind]] = [[] for _ in range(self.p)]

    def build(self) -> tuple[str, ...]:
        self.warm_up()
        for _ in range(1, self.m):
            self.steady_round()
        for j in range(self.p):
            while self.done[W][j] < self.m:
                self.put(j, W)
        return tuple("".join(program) for program in self.programs)

    # -- the primitive: append one action to rank j, keeping clocks ------------

    def put(self, j: int, kind: Kind) -> None:
        done = self.done[kind]
        mb = done[j]
        held = self.held[j] + self.grow[kind][j]
        if held > self.limit:
            raise DoesNotFit
        clock = start = self.clock[j]
        for stage, made_by, latency in self.inputs[kind][j]:  # when every input has arrived
            made = self.ends[made_by][stage]
            if mb >= len(made):
                raise DoesNotFit  # a missing input: this setting cannot build a valid order
            if made[mb] + latency > start:
                start = made[mb] + latency
        if self.done[F][j] > 0:
            bubble = self.bubble[j] = self.bubble[j] + start - clock
            if bubble > self.worst:
                self.worst = bubble
        else:
            self.first_start[j] = start
        end = self.clock[j] = start + self.cost[kind][j]
        self.ends[kind][j].append(end)
        self.held[j] = held
        done[j] = mb + 1
        self.programs[j].append(kind)

    def needed(self, stage: int, kind: Kind, mb: int) -> float:
        made = self.ends[kind][stage]
        if mb >= len(made):
            raise DoesNotFit
        return made[mb]

    def worst_bubble(self) -> float:
        return self.worst

    def pending_w(self, j: int) -> bool:
        return self.done[W][j] < self.done[I][j]

    # -- round 0 ---------------------------------------------------------------

    def warm_up(self) -> None:
        for j in range(self.p):
            self.put(j, F)
        extra = self.extra_warm_up()
        for j in range(self.p):
            for _ in range(extra[j]):
                self.put(j, F)
        for j in reversed(range(self.p)):
            self.put(j, I)

    def extra_warm_up(self) -> list[int]:
        """How many more F each rank runs before its first I: as many as fit before it comes back
        (over the link from the rank below); under ``fill_chain_warm_up`` as the fill chain says."""
        if self.knobs.fill_chain_warm_up:
            return self.fill_chain_extra()
        extra = [0] * self.p
        back = self.needed(self.p - 1, F, 0) + self.cost[I][self.p - 1]
        for j in reversed(range(self.p - 1)):
            held, clock = self.held[j], self.clock[j]
            while self.done[F][j] + extra[j] < self.m and held + self.grow[F][j] + self.i_excess[j] <= self.limit:
                if self.stop_warm_up(clock, back, j):
                    break
                held, clock = held + self.grow[F][j], clock + self.cost[F][j]
                extra[j] += 1
            back = max(clock, back + self.link[j]) + self.cost[I][j]
        for j in range(1, self.p):
            while extra[j] > 0 and extra[j] >= extra[j - 1] and self.done[F][j] + extra[j] < self.m:
                extra[j] -= 1
            # The authors' loop leaves a rank that runs all m forwards more of them than the rank above
            # has run (a link slower than the stage above it is long); those forwards' inputs do not
            # exist yet, and the setting would build nothing: cap them at the rank above's.
            extra[j] = min(extra[j], extra[j - 1])
        return extra

    def fill_chain_extra(self) -> list[int]:
        """The fill chain's F before the first I, less the one every rank has run, each rank capped at
        the rank above's (whose F its own wait for) and at m."""
        forwards = self.forwards
        assert forwards is not None, "a fill-chain setting is built only where the fill chain has forwards"
        extra = [0] * self.p
        for j in range(self.p):
            extra[j] = max(0, min(forwards[j] - 1, self.m - self.done[F][j]))
            if j > 0:
                extra[j] = min(extra[j], extra[j - 1])
        return extra

    def stop_warm_up(self, clock: float, back: float, j: int) -> bool:
        if self.knobs.bubble_before_first_i:
            return clock + self.cost[F][j] > back + self.link[j]
        return clock >= back + self.link[j]

    # -- rounds 1 .. m-1 -------------------------------------------------------

    def steady_round(self) -> None:
        wants = [self.wants_forward(j) for j in range(self.p)]
        for j in reversed(range(self.p - 1)):
            wants[j] = wants[j] and wants[j + 1]
        for j in range(self.p):
            if wants[j]:
                self.forward_with_fill(j)
        for j in reversed(range(self.p)):
            self.backward_with_fill(j)

    def wants_forward(self, j: int) -> bool:
        if self.done[F][j] >= self.m:
            return False
        if j + 1 >= self.p or not self.knobs.prioritize_i or self.done[F][j] < self.done[F][j + 1] + 2:
            return True
        comes_back = self.clock[j + 1] + self.cost[F][j + 1] + self.cost[I][j + 1] + self.link[j]
        if self.clock[j] >= comes_back:
            return False
        if self.clock[j] + self.cost[F][j] + self.w_cost_to_fit(j, self.grow[F][j]) <= comes_back:
            return True
        return comes_back - self.clock[j] > self.worst_bubble() - self.bubble[j]

    def w_cost_to_fit(self, j: int, grow: float) -> float:
        """The time the W needed to make room for ``grow`` more on rank j would take."""
        held, cost, count = self.held[j] + grow, 0.0, 0
        while held > self.limit and self.done[W][j] + count < self.done[I][j]:
            held += self.grow[W][j]
            cost += self.cost[W][j]
            count += 1
        return cost

    def forward_with_fill(self, j: int) -> None:
        self.make_room(j, F)
        if j > 0:
            self.fill_wait(j, self.needed(j - 1, F, self.done[F][j]) + self.link[j - 1])
        self.put(j, F)

    def backward_with_fill(self, j: int) -> None:
        self.make_room(j, I)
        if j + 1 < self.p:
            self.fill_wait(j, self.needed(j + 1, I, self.done[I][j]) + self.link[j])
        if j == 0 and self.done[F][j] == self.m:
            while self.pending_w(j):
                self.put(j, W)
        self.put(j, I)

    def make_room(self, j: int, kind: Kind) -> None:
        room = self.grow[kind][j] + (self.i_excess[j] if kind == F else 0.0)
        while self.held[j] + room > self.limit:
            if not self.pending_w(j):
                raise DoesNotFit
            self.put(j, W)

    def fill_wait(self, j: int, ready: float) -> None:
        """Run W while they end before ``ready``; then maybe one more into the rest of the wait."""
        while self.pending_w(j) and self.clock[j] + self.cost[W][j] <= ready:
            self.put(j, W)
        if not self.pending_w(j) or self.clock[j] >= ready:
            return
        small = ready - self.clock[j] <= self.worst_bubble() - self.bubble[j]
        if not small or self.knobs.fill_small_gaps:
            self.put(j, W)
