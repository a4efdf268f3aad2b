"""Small optimizer instances for tests: random valid orders, brute force, hypothesis strategies."""

from __future__ import annotations

import itertools
import random

from hypothesis import strategies as st

from pipeforge.ir import Action, ActionKind, CostModel, MemorySpec, Placement, Schedule, Step
from pipeforge.optimizer.evaluate import Graph, Problem, evaluate
from pipeforge.semantics import needs

F, B, I, W = ActionKind.F, ActionKind.B, ActionKind.I, ActionKind.W


def split_work(p: int, m: int) -> list[Action]:
    return [Action(s, k, mb) for s in range(p) for mb in range(m) for k in (F, I, W)]


def fused_work(p: int, m: int) -> list[Action]:
    return [Action(s, k, mb) for s in range(p) for mb in range(m) for k in (F, B)]


def random_programs(p: int, actions: list[Action], seed: int,
                    placement: Placement | None = None) -> tuple[tuple[Action, ...], ...]:
    """A random linear extension of the dependencies, dealt to the ranks: always runs.

    ``p`` is the number of ranks; ``placement`` (default: stage s on rank s) maps stages to ranks.
    """
    rng = random.Random(seed)
    stages = 1 + max(a.stage for a in actions)
    placement = placement or Placement.loop(stages, stages)
    done: set[Action] = set()
    programs: list[list[Action]] = [[] for _ in range(p)]
    left = set(actions)
    while left:
        ready = sorted(a for a in left if all(any(d in done for d in producers) for producers, _, _ in needs(a, stages)))
        pick = rng.choice(ready)
        programs[placement.rank_of(pick.stage)].append(pick)
        done.add(pick)
        left.discard(pick)
    return tuple(tuple(program) for program in programs)


def make_schedule(p: int, m: int, programs, costs: CostModel | None = None,
                  limit: float | None = None, name: str = "random", placement: Placement | None = None) -> Schedule:
    steps = tuple(tuple(Step((a,)) for a in program) for program in programs)
    memory = MemorySpec(limit) if limit is not None else None
    placement = placement or Placement.loop(p, p)
    return Schedule(name, p, len(placement.stage_to_rank), m, (placement,), steps, costs, memory)


def one_f_one_b(p: int, m: int, split: bool = False) -> tuple[tuple[Action, ...], ...]:
    """1F1B (PipeDream-Flush) per rank; with ``split`` each B becomes I then W."""
    def backward(s: int, mb: int) -> list[Action]:
        return [Action(s, I, mb), Action(s, W, mb)] if split else [Action(s, B, mb)]

    programs = []
    for r in range(p):
        warm = min(m, p - 1 - r)
        order = [Action(r, F, mb) for mb in range(warm)]
        for i in range(m - warm):
            order += [Action(r, F, warm + i)] + backward(r, i)
        for i in range(m - warm, m):
            order += backward(r, i)
        programs.append(tuple(order))
    return tuple(programs)


def rank_orders(actions: list[Action], p: int) -> list[tuple[Action, ...]]:
    """Every order of one rank's actions that keeps F before I before W of each microbatch."""
    chains = {}
    for a in sorted(actions):
        chains.setdefault(a.microbatch, []).append(a)
    for mb in chains:
        chains[mb].sort(key=lambda a: (F, I, W).index(a.kind))
    slots = [mb for mb, chain in chains.items() for _ in chain]
    found = []
    for arrangement in sorted(set(itertools.permutations(slots))):
        taken = {mb: 0 for mb in chains}
        order = []
        for mb in arrangement:
            order.append(chains[mb][taken[mb]])
            taken[mb] += 1
        found.append(tuple(order))
    return found


def brute_force_best_span(problem: Problem) -> float | None:
    """The smallest worst span over every order that runs and fits, by enumeration."""
    p, m = problem.ranks, problem.microbatches
    graph = Graph(problem, split_work(p, m))
    per_rank = [rank_orders([a for a in graph.actions if a.stage == r], p) for r in range(p)]
    best = None
    for combination in itertools.product(*per_rank):
        evaluation = evaluate(graph, tuple(graph.ids(order) for order in combination))
        if evaluation is None or not evaluation.fits(problem.memory_limit):
            continue
        best = evaluation.max_span if best is None else min(best, evaluation.max_span)
    return best


costs_strategy = st.builds(
    lambda f, i, w, comm: CostModel(F=f, I=i, W=w, comm=comm),
    st.sampled_from([1.0, 2.0, 1.5]), st.sampled_from([1.0, 2.0, 0.5]),
    st.sampled_from([1.0, 0.5, 2.0]), st.sampled_from([0.0, 0.25, 1.0]),
)


VALUES = st.sampled_from([0.5, 1.0, 1.5, 2.0, 3.0])


@st.composite
def per_stage_costs(draw, stages: int) -> CostModel:
    """Uniform costs, some stages' F, I or W changed, some links' latency changed."""
    base = CostModel(F=draw(VALUES), I=draw(VALUES), W=draw(VALUES), comm=draw(st.sampled_from([0.0, 0.25, 1.0])))
    changed = draw(st.lists(st.tuples(st.integers(0, stages - 1), st.sampled_from("FIW"), VALUES), max_size=3))
    per_stage = tuple({(s, k): (s, k, v) for s, k, v in changed}.values())
    links = tuple(draw(st.lists(st.sampled_from([0.0, 0.5, 2.0]), max_size=stages - 1)))
    return CostModel(F=base.F, I=base.I, W=base.W, comm=base.comm, per_stage=per_stage, links=links)
