"""Random orders that run and fit a memory limit: a random list schedule that starts an action only where
its rank's memory stays within the limit, with at most a random number of microbatches under way (valid
orders at small limits, where random orders rarely fit; one at a time always fits where one microbatch does)."""

from __future__ import annotations

import random

from pipeforge.optimizer.evaluate import evaluate
from pipeforge.sim.workgraph import Order, WorkGraph


def fitting_order(graph: WorkGraph, limit: float, seed: int, tries: int = 50) -> Order | None:
    """A random order of ``graph`` whose every rank stays within ``limit`` (None if ``tries`` all deadlock)."""
    rng = random.Random(seed)
    microbatches = len({a.microbatch for a in graph.actions})
    for attempt in range(tries):
        under_way = 1 if attempt == tries - 1 else rng.randint(1, microbatches)
        order = _attempt(graph, limit, rng, under_way)
        if order is not None:
            evaluation = evaluate(graph, order)
            if evaluation is not None and evaluation.fits(limit):
                return order
    return None


def _attempt(graph: WorkGraph, limit: float, rng: random.Random, under_way: int) -> Order | None:
    ranks, nodes, actions = graph.shape.ranks, len(graph.actions), graph.actions
    held, done = [0.0] * ranks, [False] * nodes
    left_of = {}  # microbatch -> actions not yet placed
    for a in actions:
        left_of[a.microbatch] = left_of.get(a.microbatch, 0) + 1
    started: set = set()
    programs: list[list[int]] = [[] for _ in range(ranks)]
    left = set(range(nodes))
    while left:
        ready = [a for a in sorted(left) if all(d < nodes and done[d] for d, _ in graph.deps[a])
                 and held[graph.rank[a]] + graph.added[a] <= limit + 1e-9
                 and (actions[a].microbatch in started or len(started) < under_way)]
        if not ready:
            return None
        backward = [a for a in ready if graph.added[a] == 0]  # I and W first half the time: fewer deadlocks
        pick = rng.choice(backward if backward and rng.random() < 0.5 else ready)
        rank, mb = graph.rank[pick], actions[pick].microbatch
        held[rank] += graph.delta[pick]
        programs[rank].append(pick)
        done[pick] = True
        left.discard(pick)
        started.add(mb)
        left_of[mb] -= 1
        if left_of[mb] == 0:
            started.discard(mb)
    return tuple(tuple(p) for p in programs)
