"""Recompute chosen while scheduling: per (stage, microbatch), keep an F's activations or only its checkpoint.

``recompute_orders(problem, deadline)`` yields the per-rank orders (action keys, R included) of every
setting (``SETTINGS``) that does not get stuck, for one stage a rank in one chain (``supports``). Each F keeps its
activations when they fit beside the room one rebuild needs, else only its checkpoint (it is recomputed);
each R runs in a wait of its rank before its backward, or just before it. The caller compiles each order
(its R make their F hold the checkpoint: ``semantics.effects_of``) and keeps the best by simulation; every
order fits ``problem.memory_limit`` by construction. How it decides: ``docs/optimize.md`` (Recompute).
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import TypeVar

from pipeforge.ir import ActionKind
from pipeforge.optimizer.evaluate import TOLERANCE, Problem
from pipeforge.optimizer.units import integer_units
from pipeforge.semantics import SPLIT_WORK_TEXTS, ActionKey, effects_of, stage_effect
from pipeforge.sim.bounds import trip_time

F, I, W, R = (ActionKind.F.value, ActionKind.I.value, ActionKind.W.value,  # noqa: E741
              ActionKind.R.value)
NEVER = float("inf")
Key = TypeVar("Key", bound=ActionKey)  # an Action or a plain key: kept_where_room returns what it is given


@dataclass(frozen=True)
class Setting:
    """``ahead``: a rank runs at most this share of 1F1B's forwards in flight (ranks - rank), at least one
    (None: as many as memory allows); ``prefetch``: how many microbatches ahead of its next backward a
    rank may rebuild in a wait (0: an R only once its backward's gradient is there); ``forward_first``:
    with an F and a prefetched R both ready, the F first; ``even``: a rank whose forwards in flight
    (its cap) cannot all keep their activations keeps them for only as many as leave room for the
    others' checkpoints and one rebuild at any time (else it keeps them while they fit); ``by_trip``: the
    share is of the forwards that keep the rank busy for one round trip (its least round trip over its
    own F, I and W), not of 1F1B's."""

    ahead: float | None
    prefetch: int
    forward_first: bool
    even: bool = True
    by_trip: bool = False


# the settings that won on some row of the Zero Bubble paper's Table 5 at 0.5p, 0.75p or p (or came within
# 0.5 % of the winner), the most often first
SETTINGS = (Setting(1.0, 1, True), Setting(1.0, 1, True, even=False, by_trip=True), Setting(1.25, 1, True),
            Setting(1.0, 1, True, even=False), Setting(1.0, 2, True, even=False, by_trip=True),
            Setting(1.25, 2, True), Setting(1.25, 1, False), Setting(1.05, 1, True, even=False, by_trip=True),
            Setting(1.25, 2, True, even=False), Setting(1.0, 2, True), Setting(None, 1, False))


class NothingCanStart(Exception):
    """No rank can start anything (the memory limit leaves no room for one forward and one rebuild)."""


def supports(problem: Problem) -> bool:
    """One chain, one stage a rank, with a memory limit."""
    placements = problem.placements
    return (len(placements) == 1 and problem.stages == problem.ranks and problem.memory_limit is not None
            and len(set(placements[0].stage_to_rank)) == problem.stages)


def recompute_orders(problem: Problem, deadline: float | None = None
                     ) -> Iterator[tuple[Setting, tuple[tuple[ActionKey, ...], ...]]]:
    """The orders of every setting that does not get stuck (built in exact integer units), one at a time;
    past ``deadline`` (``time.monotonic()``) no further setting is started once one has an order."""
    exact = replace(problem, costs=integer_units(problem.costs).costs)
    found = False
    for setting in SETTINGS:
        if deadline is not None and time.monotonic() > deadline and found:
            return
        try:
            keys = _Scheduler(exact, setting).run()
        except NothingCanStart:
            continue
        found = True
        yield setting, tuple(kept_where_room(exact, program) for program in keys)


def kept_where_room(problem: Problem, program: tuple[Key, ...]) -> tuple[Key, ...]:
    """``program`` (one rank's keys) without the R of each (stage, microbatch) whose activations fit from
    its F to its R all the same (earliest first): its F keeps them, no rebuild runs. With the order fixed,
    dropping an action never starts anything later (timing is monotone in the work), so it only gains."""
    memory, limit = problem.memory, problem.memory_limit
    if limit is None:
        return program
    effects = effects_of(memory, program)
    held, prefix = 0.0, []
    for key in program:
        added, released = effects(key)
        held += added - released
        prefix.append(held)
    forward = {(key[0], key[2]): i for i, key in enumerate(program) if key[1] == F}
    dropped = set()
    for j, key in enumerate(program):
        if key[1] != R:
            continue
        i = forward[(key[0], key[2])]
        extra = stage_effect(memory, ActionKind.F, key[0])[0] - stage_effect(memory, ActionKind.F, key[0], True)[0]
        if max(prefix[i:j]) + extra <= limit + TOLERANCE:
            dropped.add(j)
            for k in range(i, j):
                prefix[k] += extra
    return tuple(key for j, key in enumerate(program) if j not in dropped)


class _Scheduler:
    """The list scheduler: the rank that can start first runs its most urgent action (module doc)."""

    def __init__(self, problem: Problem, setting: Setting):
        self.setting, self.m, self.p = setting, problem.microbatches, problem.stages
        self.limit: float = NEVER if problem.memory_limit is None else problem.memory_limit
        memory, costs = problem.memory, problem.costs
        self.stage_of = [0] * problem.ranks
        for s, r in enumerate(problem.placements[0].stage_to_rank):
            self.stage_of[r] = s
        self.rank_of = list(problem.placements[0].stage_to_rank)
        stages = range(self.p)
        self.cost = {(k, s): costs.duration(ActionKind(k), s) for k in (*SPLIT_WORK_TEXTS, R) for s in stages}
        self.latency = [costs.latency(s, s + 1) if s + 1 < self.p else 0.0 for s in stages]
        self.full = [stage_effect(memory, ActionKind.F, s)[0] for s in stages]
        self.kept = [stage_effect(memory, ActionKind.F, s, recomputed=True)[0] for s in stages]
        self.rebuild = [stage_effect(memory, ActionKind.R, s, recomputed=True)[0] for s in stages]
        self.after_i = [_net(stage_effect(memory, ActionKind.I, s)) for s in stages]  # adds where weight_grad > F's
        self.after_w = [_net(stage_effect(memory, ActionKind.W, s)) for s in stages]
        ranks = problem.ranks
        if setting.by_trip:
            work = [self.cost[(F, s)] + self.cost[(I, s)] + self.cost[(W, s)] for s in stages]
            flight = [trip_time(costs, self.rank_of, s) / work[s] if work[s] > 0 else self.m for s in stages]
        else:
            flight = [float(ranks - self.rank_of[s]) for s in stages]
        self.cap = [self.m if setting.ahead is None else max(1, math.ceil(setting.ahead * flight[s] - TOLERANCE))
                    for s in stages]
        # at most this many kept activations of microbatches after a rebuild's (beside the checkpoints in
        # flight and the rebuild itself)
        self.beside = [math.floor((self.limit - self.rebuild[s] - min(self.cap[s], self.m) * self.kept[s])
                                  / self.full[s] + TOLERANCE) if self.full[s] > 0 else self.m for s in stages]
        self.holding: list[set[int]] = [set() for _ in stages]  # in flight with their activations kept
        self.slots = [None if not setting.even or self.cap[s] * self.full[s] <= self.limit + TOLERANCE else
                      max(0, math.floor((self.limit - self.rebuild[s] - self.cap[s] * self.kept[s]) /
                                        (self.full[s] - self.kept[s]) + TOLERANCE)) if self.full[s] > self.kept[s]
                      else 0 for s in stages]
        self.next = {kind: [0] * self.p for kind in SPLIT_WORK_TEXTS}
        self.recomputed: list[set[int]] = [set() for _ in stages]
        self.rebuilt: list[set[int]] = [set() for _ in stages]
        self.pending: list[list[int]] = [[] for _ in stages]  # recomputed, not yet rebuilt, in order
        self.end: dict[tuple[int, str, int], float] = {}
        self.free = [0.0] * ranks
        self.held = [0.0] * ranks
        self.programs: list[list[ActionKey]] = [[] for _ in range(ranks)]

    def run(self) -> tuple[tuple[ActionKey, ...], ...]:
        proposals = [self.proposal(r) for r in range(len(self.free))]
        while True:
            start, rank, key = min(proposals)
            if key is None:
                if all(n == self.m for n in self.next[W]):
                    return tuple(tuple(program) for program in self.programs)
                raise NothingCanStart
            self.commit(rank, key, start)
            s = key[0]
            for t in {s, s - 1, s + 1}:
                if 0 <= t < self.p:
                    proposals[self.rank_of[t]] = self.proposal(self.rank_of[t])

    def proposal(self, r: int) -> tuple[float, int, ActionKey | None]:
        s = self.stage_of[r]
        options = self.options(s)
        if not options:
            return (NEVER, r, None)
        at = max(self.free[r], min(ready for ready, _, _ in options))
        _, _, key = min((rank, ready, key) for ready, rank, key in options if ready <= at + TOLERANCE)
        return (at, r, key)

    def options(self, s: int) -> list[tuple[float, int, ActionKey]]:
        """(ready time, priority, key) of what stage s's rank may run next (the least priority runs)."""
        found: list[tuple[float, int, ActionKey]] = []
        r, m, held, limit = self.rank_of[s], self.m, self.held[self.rank_of[s]], self.limit
        free = self.free[r]
        n_i, n_f, n_w = self.next[I][s], self.next[F][s], self.next[W][s]
        pending = self.pending[s]
        if n_i < n_f:
            gradient = self.gradient_time(s, n_i)
            if n_i in self.recomputed[s] and n_i not in self.rebuilt[s]:
                if gradient is not None and held + self.rebuild[s] <= limit + TOLERANCE:
                    found.append((max(free, gradient), 0, (s, R, n_i, 0)))
            elif gradient is not None and held + max(self.after_i[s], 0.0) <= limit + TOLERANCE:  # an I may add
                found.append((max(free, gradient), 0, (s, I, n_i, 0)))
        if n_f < m and n_f - n_i < self.cap[s]:
            ready = 0.0 if s == 0 else self.end.get((s - 1, F, n_f))
            if ready is not None:
                ready += 0.0 if s == 0 else self.latency[s - 1]
                room = self.rebuild[s] if self.setting.even else 0.0
                if self.keeps(s, held) or held + self.kept[s] + room <= limit + TOLERANCE:
                    found.append((max(free, ready), 1 if self.setting.forward_first else 2, (s, F, n_f, 0)))
        if pending and pending[0] < n_i + self.setting.prefetch and held + self.rebuild[s] <= limit + TOLERANCE:
            found.append((free, 2 if self.setting.forward_first else 1, (s, R, pending[0], 0)))
        if n_w < n_i:
            found.append((free, 3, (s, W, n_w, 0)))
        return found

    def keeps(self, s: int, held: float) -> bool:
        """Whether the next F of stage s keeps its activations: they fit, and where a recomputed microbatch
        waits for its rebuild, they and the others kept after it leave room for it (``beside``)."""
        if self.setting.even:
            slots = self.slots[s]
            reserve = self.rebuild[s] if self.pending[s] or slots is not None else 0.0
            if slots is not None and len(self.holding[s]) >= slots:
                return False
            return held + self.full[s] + reserve <= self.limit + TOLERANCE
        if held + self.full[s] > self.limit + TOLERANCE:
            return False
        pending = self.pending[s]
        return not pending or sum(mb > pending[0] for mb in self.holding[s]) < self.beside[s]

    def gradient_time(self, s: int, mb: int) -> float | None:
        """When the gradient of (s, mb) is on s's rank (the loss: its own F), None while it is not made."""
        if s == self.p - 1:
            return self.end.get((s, F, mb))
        done = self.end.get((s + 1, I, mb))
        return None if done is None else done + self.latency[s]

    def commit(self, r: int, key: ActionKey, start: float) -> None:
        s, kind, mb, _ = key
        self.end[(s, kind, mb)] = self.free[r] = start + self.cost[(kind, s)]
        program = self.programs[r]
        if kind == F:
            if self.keeps(s, self.held[r]):
                self.held[r] += self.full[s]
                self.holding[s].add(mb)
            else:
                self.held[r] += self.kept[s]
                self.recomputed[s].add(mb)
                self.pending[s].append(mb)
            self.next[F][s] = mb + 1
        elif kind == R:
            self.held[r] += self.rebuild[s]
            self.rebuilt[s].add(mb)
            self.pending[s].remove(mb)
        elif kind == I:
            self.held[r] += self.after_i[s]
            self.holding[s].discard(mb)
            self.next[I][s] = mb + 1
        else:
            self.held[r] += self.after_w[s]
            self.next[W][s] = mb + 1
        program.append((s, ActionKind(kind), mb, 0))


def _net(effect: tuple[float, float]) -> float:
    """What an action's ``(added, released)`` changes a rank's held memory by."""
    return effect[0] - effect[1]
