"""Schedules built by hand for the simulator's tests: textbook orders and random consistent ones."""

from __future__ import annotations

import random

from pipeforge.ir import Placement, Schedule, programs_from_tokens


def schedule_of(rows: list[list[str]], *, stages: int | None = None, microbatches: int = 1,
                placement: Placement | None = None, name: str = "hand") -> Schedule:
    ranks = len(rows)
    stages = stages or ranks
    placement = placement or Placement.loop(stages, ranks)
    return Schedule(name, ranks, stages, microbatches, (placement,), programs_from_tokens(rows))


def one_f_one_b(ranks: int, microbatches: int) -> Schedule:
    """PipeDream-Flush: warm up with P-1-r forwards, alternate, cool down with backwards."""
    rows = []
    for r in range(ranks):
        warmup = min(microbatches, ranks - 1 - r)
        row = [f"{r}F{m}" for m in range(warmup)]
        for i in range(microbatches - warmup):
            row += [f"{r}F{warmup + i}", f"{r}B{i}"]
        row += [f"{r}B{i}" for i in range(microbatches - warmup, microbatches)]
        rows.append(row)
    return schedule_of(rows, microbatches=microbatches, name="1f1b")


def gpipe(ranks: int, microbatches: int) -> Schedule:
    rows = [[f"{r}F{m}" for m in range(microbatches)] + [f"{r}B{m}" for m in range(microbatches)]
            for r in range(ranks)]
    return schedule_of(rows, microbatches=microbatches, name="gpipe")


def random_consistent(seed: int, ranks: int, stages: int, microbatches: int, split: bool,
                      placement: str = "loop") -> Schedule:
    """Per-rank programs cut from one random topological order of every action: always consistent."""
    rng = random.Random(seed)
    place = Placement.loop(stages, ranks) if placement == "loop" else Placement.v(stages, ranks)
    done: set[tuple[str, int, int]] = set()
    pending = [("F", s, m) for s in range(stages) for m in range(microbatches)]
    pending += [(k, s, m) for s in range(stages) for m in range(microbatches) for k in (("I", "W") if split else ("B",))]
    rows: list[list[str]] = [[] for _ in range(ranks)]
    while pending:
        ready = [a for a in pending if inputs_done(a, done, stages)]
        kind, s, m = rng.choice(ready)
        pending.remove((kind, s, m))
        done.add((kind, s, m))
        rows[place.rank_of(s)].append(f"{s}{kind}{m}")
    return schedule_of(rows, stages=stages, microbatches=microbatches, placement=place, name=f"random{seed}")


def inputs_done(action: tuple[str, int, int], done: set, stages: int) -> bool:
    """Written from docs/semantics.md, not from pipeforge.semantics: whether an action's inputs are done."""
    kind, s, m = action
    if kind == "F":
        return s == 0 or ("F", s - 1, m) in done
    if kind == "W":
        return ("I", s, m) in done
    upstream = s == stages - 1 or ("B", s + 1, m) in done or ("I", s + 1, m) in done
    return ("F", s, m) in done and upstream
