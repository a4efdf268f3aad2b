"""Greedy list scheduling for any placement (V, interleaved, loop): the rank that can start first
runs its most urgent ready action.

``list_schedule_orders(problem, deadline)`` -> one order per combination of the priority rules
(``RULES``) that does not get stuck; the caller keeps the best by simulation. ``supports(problem)``
says where it applies. The rules: ``docs/optimize.md`` (List scheduling).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace

from pipeforge.ir import ActionKind
from pipeforge.optimizer.evaluate import TOLERANCE, Problem, stage_growth
from pipeforge.optimizer.units import integer_units
from pipeforge.semantics import SPLIT_WORK_TEXTS, ActionKey, needs

# Kinds as their letters: dict keys in the hot loop, where an exact str hashes fastest. A key
# (stage, "F", microbatch, chain) is equal to the Action it names (semantics.ActionKey).
F, I, W = ActionKind.F.value, ActionKind.I.value, ActionKind.W.value  # noqa: E741
NEVER = float("inf")


@dataclass(frozen=True)
class Rules:
    backward_first: bool
    late_stage_first: bool
    fair_memory: bool


RULES = tuple(Rules(b, s, f) for b in (True, False) for s in (True, False) for f in (True, False))


class NothingCanStart(Exception):
    """No rank can start anything: the memory limit blocks every forward and no W is left to free it."""


def supports(problem: Problem) -> bool:
    """One chain (a bidirectional schedule's microbatches are split between chains by the input)."""
    return len(problem.placements) == 1


def list_schedule_orders(problem: Problem, deadline: float | None = None
                         ) -> list[tuple[Rules, tuple[tuple[ActionKey, ...], ...]]]:
    """The per-rank orders (as action keys) of every rule combination that does not get stuck
    (timed in exact integer units: the same orders whatever the cost units); past ``deadline``
    (``time.monotonic()``) no further combination is started."""
    exact = replace(problem, costs=integer_units(problem.costs).costs)
    found = []
    for rules in RULES:
        if deadline is not None and time.monotonic() > deadline:
            break
        try:
            found.append((rules, _ListScheduler(exact, rules).run()))
        except NothingCanStart:
            continue
    return found


def _input_pattern(kind: str, stage: int, chain: int, stages: int, costs):
    """What ``kind`` (its text: F, I, W) on ``stage`` needs (``semantics.needs``, alike for each microbatch): per input,
    the (stage, kind) alternatives, the producer's lane (chain, stage) when the edge is between stages
    (so maybe between ranks), else None, and that edge's latency across ranks (``CostModel.latency``);
    looked up once. Only the kinds the scheduler runs (F, I, W: the work is split) are looked for."""
    return tuple((tuple((p[0], p[1]._value_) for p in producers if p[1] in SPLIT_WORK_TEXTS),
                  (chain, producers[0][0]) if send is not None else None, costs.latency(producers[0][0], stage))
                 for producers, send, _ in needs((stage, kind, 0, chain), stages))


class _ListScheduler:
    def __init__(self, problem: Problem, rules: Rules):
        self.problem, self.rules = problem, rules
        self.m, self.comm, self.stages = problem.microbatches, problem.costs.comm, problem.stages
        self.limit = problem.memory_limit if problem.memory_limit is not None else NEVER
        self.grow = stage_growth(problem)  # per kind, per stage (M_B): semantics.MEMORY at the stage's sizes
        self.lanes = [(c, s) for c, placement in enumerate(problem.placements) for s in range(problem.stages)]
        self.rank_of = {(c, s): problem.placements[c].stage_to_rank[s] for c, s in self.lanes}
        self.cost = {(k, s): problem.costs.duration(ActionKind(k), s) for k in SPLIT_WORK_TEXTS
                     for s in range(problem.stages)}
        self.next = {(k, lane): 0 for k in SPLIT_WORK_TEXTS for lane in self.lanes}
        self.inputs = {(k, s, c): _input_pattern(k, s, c, problem.stages, problem.costs)
                       for k in SPLIT_WORK_TEXTS for c, s in self.lanes}
        self.end: dict[ActionKey, float] = {}
        self.free = [0.0] * problem.ranks
        self.held = [0.0] * problem.ranks
        self.lane_held = {lane: 0.0 for lane in self.lanes}
        self.programs: list[list[ActionKey]] = [[] for _ in range(problem.ranks)]
        order = sorted(self.lanes, key=lambda lane: lane[1], reverse=rules.late_stage_first)
        self.rank_lanes = [[lane for lane in order if self.rank_of[lane] == r] for r in range(problem.ranks)]
        self.waiting = self._waiting_ranks()

    def _waiting_ranks(self) -> dict[tuple[str, int, int], tuple[int, ...]]:
        """(kind, stage, chain) -> the other ranks with an action that needs such an action (the inputs
        of ``semantics.needs``): the ranks whose proposal may change when one ends."""
        found: dict[tuple[str, int, int], set[int]] = {}
        for (_, stage, chain), inputs in self.inputs.items():
            for producers, _, _ in inputs:
                for producer_stage, made_by in producers:
                    found.setdefault((made_by, producer_stage, chain), set()).add(self.rank_of[(chain, stage)])
        return {key: tuple(sorted(ranks)) for key, ranks in found.items()}

    def run(self) -> tuple[tuple[ActionKey, ...], ...]:
        """Each step the earliest proposal runs; a rank's proposal depends only on its own state and on
        the ends of its candidates' inputs, so only the rank that ran and the ranks waiting on what it
        ran propose anew."""
        total = 3 * self.m * self.problem.stages
        proposals = [self.proposal(r) for r in range(self.problem.ranks)]
        for _ in range(total):
            start, rank, key = min(proposals)
            if start == NEVER:
                raise NothingCanStart
            assert key is not None, "a proposal that starts names its action (proposal)"
            self.commit(rank, key, start)
            proposals[rank] = self.proposal(rank)
            for r in self.waiting.get((key[1], key[0], key[3]), ()):
                if r != rank:
                    proposals[r] = self.proposal(r)
        return tuple(tuple(program) for program in self.programs)

    def proposal(self, r: int) -> tuple[float, int, ActionKey | None]:
        options = [(ready, key) for key, ready in self.candidates(r)]
        if not options:
            return (NEVER, r, None)
        at = max(self.free[r], min(ready for ready, _ in options))
        ready_now = [key for ready, key in options if ready <= at + TOLERANCE]
        return (at, r, self.choose(r, ready_now))

    def candidates(self, r: int):
        """(key, ready time) of each stage's next F, I and W on rank r whose inputs are made."""
        for c, s in self.rank_lanes[r]:
            for kind in SPLIT_WORK_TEXTS:
                mb = self.next[(kind, (c, s))]
                if mb >= self.m:
                    continue
                key = (s, kind, mb, c)
                ready = self.ready_time(key, r)
                if ready is not None and (kind != F or self.may_forward(r, (c, s))):
                    yield key, ready

    def may_forward(self, r: int, lane: tuple[int, int]) -> bool:
        """An F may be proposed when it fits (or a W could make room) and its stage is within its share."""
        if self.rules.fair_memory and self.limit != NEVER:
            share = self.limit / len(self.rank_lanes[r])
            if self.lane_held[lane] + self.grow[F][lane[1]] > share + TOLERANCE:
                return False
        return self.held[r] + self.grow[F][lane[1]] <= self.limit + TOLERANCE or self.has_w(r)

    def ready_time(self, key: ActionKey, r: int) -> float | None:
        """When every input of ``key`` (``semantics.needs``) has arrived on rank r; None if one is not made."""
        stage, kind, mb, chain = key
        ready, end = 0.0, self.end
        for producers, lane, latency in self.inputs[(kind, stage, chain)]:
            for producer_stage, made_by in producers:
                done = end.get((producer_stage, made_by, mb, chain))
                if done is not None:
                    break
            else:
                return None
            if lane is not None and self.rank_of[lane] != r:
                done += latency
            if done > ready:
                ready = done
        return ready

    def has_w(self, r: int) -> bool:
        return any(self.next[(W, lane)] < self.next[(I, lane)] for lane in self.rank_lanes[r])

    def choose(self, r: int, ready: list[ActionKey]) -> ActionKey:
        by_kind = {kind: [key for key in ready if key[1] == kind] for kind in SPLIT_WORK_TEXTS}
        fitting = [key for key in by_kind[F] if self.held[r] + self.grow[F][key[0]] <= self.limit + TOLERANCE]
        if by_kind[F] and not fitting and by_kind[W] and not by_kind[I]:
            return by_kind[W][0]
        by_kind[F] = fitting  # an F's growth is its stage's (semantics.MEMORY): less under recompute or offload
        first, second = (I, F) if self.rules.backward_first else (F, I)
        for kind in (first, second, W):
            if by_kind[kind]:
                return by_kind[kind][0]
        return ready[0]

    def commit(self, r: int, key: ActionKey, start: float) -> None:
        s, kind, mb, c = key
        self.end[key] = start + self.cost[(kind, s)]
        self.free[r] = self.end[key]
        self.held[r] += self.grow[kind][s]
        self.lane_held[(c, s)] += self.grow[kind][s]
        self.next[(kind, (c, s))] = mb + 1
        self.programs[r].append(key)
