"""Proven lower bounds on the worst span (and so on the bubble rate) of any order.

The search space is every compute order of the problem's (stage, microbatch)
pairs with the backward split into I and W (a B is an I followed at once by
its W, so it is covered when B = I + W). Two bounds:

- ``busy``: a rank's span is at least the sum of its compute durations.
- ``round trip`` (one stage a rank, loop placement, stage r on rank r): the
  first I on rank r starts no earlier than one *round trip* after its first F
  (F down to the last stage and I back, with ``comm`` on every hop); before
  the first I the rank can run only F, at most ``floor(limit)`` of them. After
  its last F, the rank waits one round trip (less that F) for that
  microbatch's I; what it can run meanwhile is the I and W of microbatches it
  still holds, and what it holds is capped by the memory limit: ``k`` with I
  pending and ``j`` with only W pending need ``k + weights * j <= limit``.
  When the rank cannot run every F before its first I, the two idle windows
  are disjoint and add up.

At p=8, m=24, memory limit 8, the Zero Bubble paper's costs, the round-trip
bound on rank 0 equals the span of ZB-1p: that schedule is optimal there.
"""

from __future__ import annotations

import math

from pipeforge.ir import ActionKind
from pipeforge.optimize.evaluate import TOLERANCE, Graph, Problem

F, B, I, W = ActionKind.F, ActionKind.B, ActionKind.I, ActionKind.W


def busy_per_rank(graph: Graph) -> list[float]:
    """Each rank's least compute time: F and the cheaper of B or I + W, for each forward it runs."""
    problem, cost = graph.problem, graph.problem.costs.duration
    busy = [0.0] * problem.ranks
    for action, rank in zip(graph.actions, graph.rank):
        if action.kind is F:
            s = action.stage
            busy[rank] += cost(F, s) + min(cost(B, s), cost(I, s) + cost(W, s))
    return busy


def round_trip(problem: Problem, r: int) -> float:
    """From the start of F on stage r to the earliest start of I on stage r, same microbatch."""
    cost, comm = problem.costs.duration, problem.costs.comm
    down = sum(comm + cost(F, s) for s in range(r + 1, problem.stages))
    up = sum(_backward(problem, s) + comm for s in range(r + 1, problem.stages))
    return cost(F, r) + down + up


def _backward(problem: Problem, stage: int) -> float:
    return min(problem.costs.duration(I, stage), problem.costs.duration(B, stage))


def tail_work(problem: Problem, r: int, limit: float) -> float:
    """The most I/W work rank r can hold ready for after its last F (memory-capped)."""
    cost_i, cost_w = problem.costs.duration(I, r), problem.costs.duration(W, r)
    m, weights = problem.microbatches, problem.weights
    best = 0.0
    for k in range(1, min(m, math.floor(limit + TOLERANCE)) + 1):
        room = limit - k
        j = m - k if weights <= 0 else min(m - k, math.floor(room / weights + TOLERANCE))
        best = max(best, (k - 1) * (cost_i + cost_w) + j * cost_w)
    return best


def round_trip_idle(problem: Problem, r: int) -> float:
    """Idle time rank r cannot avoid inside its span (0 when the shape is not one stage a rank)."""
    limit = problem.memory_limit if problem.memory_limit is not None else float(problem.microbatches)
    trip = round_trip(problem, r)
    first_burst = min(problem.microbatches, math.floor(limit + TOLERANCE))
    head = max(0.0, trip - first_burst * problem.costs.duration(F, r))
    tail = max(0.0, trip - problem.costs.duration(F, r) - tail_work(problem, r, limit))
    if first_burst < problem.microbatches:
        return head + tail
    return max(head, tail)


def loop_one_stage_per_rank(problem: Problem) -> bool:
    return len(problem.placements) == 1 and problem.placements[0].stage_to_rank == tuple(range(problem.ranks))


def span_lower_bound(graph: Graph) -> float:
    """A proven lower bound on the worst span of any valid order of ``graph``'s forwards."""
    problem, busy = graph.problem, busy_per_rank(graph)
    if not loop_one_stage_per_rank(problem):
        return max(busy)
    return max(busy[r] + round_trip_idle(problem, r) for r in range(problem.ranks))


def bubble_of_span(graph: Graph, span: float) -> float:
    """The bubble rate a worst span of ``span`` gives (busy time does not depend on the order)."""
    busy = busy_per_rank(graph)
    return 1.0 - (sum(busy) / len(busy)) / span if span > 0 else 0.0


def bubble_lower_bound(graph: Graph) -> float:
    return bubble_of_span(graph, span_lower_bound(graph))
