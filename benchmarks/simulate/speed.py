"""Simulator speed on a 64-rank, 256-microbatch, 2-stages-per-rank interleaved schedule, beside torch.

The orders are torch's own (``ScheduleInterleaved1F1B`` and ``ScheduleInterleavedZeroBubble``,
built from stand-in stages, no process group): 65,536 and 98,304 compute actions.
pipeforge simulates each on unit costs; torch's reference is
``torch.distributed.pipelining.schedules._simulate_comms_compute`` on the same order with
communication inserted by torch's ``_add_send_recv`` (a lockstep dry run: each action one
tick, no durations, no memory). The reference's time excludes ``_add_send_recv``.

    python -m benchmarks.simulate.speed [--ranks 64 --microbatches 256 --repeat 3]

Exits 1 when pipeforge takes 1 s or more on the ~100k-action schedule.
"""

from __future__ import annotations

import argparse
import sys
import time
import types

from pipeforge.ir import Placement, Schedule, Step, parse_action
from pipeforge.sim import simulate

BUDGET_SECONDS = 1.0


def torch_order(torch_class: str, ranks: int, microbatches: int, per_rank: int):
    """torch's compute order for every rank, from stand-in stages (only the attributes the constructor reads)."""
    import torch
    from torch.distributed.pipelining import schedules

    stages = [types.SimpleNamespace(num_stages=ranks * per_rank, group_size=ranks, group_rank=0,
                                    stage_index=v * ranks, is_first=v == 0, is_last=False,
                                    submod=torch.nn.Identity())
              for v in range(per_rank)]
    return getattr(schedules, torch_class)(stages, microbatches).pipeline_order


def as_schedule(order, ranks: int, microbatches: int, per_rank: int) -> Schedule:
    programs = tuple(tuple(Step((parse_action(str(a)),)) for a in order[r] if a is not None) for r in range(ranks))
    stages = ranks * per_rank
    return Schedule("torch", ranks, stages, microbatches, (Placement.loop(stages, ranks),), programs)


def best_time(function, repeat: int) -> tuple[float, object]:
    best, result = float("inf"), None
    for _ in range(repeat):
        start = time.perf_counter()
        result = function()
        best = min(best, time.perf_counter() - start)
    return best, result


def torch_reference(order, ranks: int, per_rank: int) -> tuple[float, int]:
    from torch.distributed.pipelining import schedules

    stages = ranks * per_rank
    compute = {r: [a for a in order[r] if a is not None] for r in range(ranks)}
    with_comms = schedules._add_send_recv(compute, stage_to_rank=lambda s: s % ranks, num_stages=stages)
    start = time.perf_counter()
    ticks = schedules._simulate_comms_compute(with_comms, lambda s: s % ranks, stages)
    return time.perf_counter() - start, max(len(row) for row in ticks.values())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=64)
    parser.add_argument("--microbatches", type=int, default=256)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    print(f"{'torch order':<30} {'actions':>8} {'pipeforge s':>12} {'sim+bounds s':>13} {'torch s':>9} "
          f"{'torch/pipeforge':>16} {'bubble':>8} {'torch ticks':>12}")
    slowest = 0.0
    for torch_class in ("ScheduleInterleaved1F1B", "ScheduleInterleavedZeroBubble"):
        order = torch_order(torch_class, args.ranks, args.microbatches, 2)
        schedule = as_schedule(order, args.ranks, args.microbatches, 2)
        seconds, timeline = best_time(lambda: simulate(schedule), args.repeat)
        bound_seconds, _ = best_time(lambda: simulate(schedule).bounds, 1)
        reference_seconds, ticks = torch_reference(order, args.ranks, 2)
        slowest = max(slowest, seconds)
        print(f"{torch_class:<30} {schedule.action_count():>8} {seconds:>12.3f} {bound_seconds:>13.3f} "
              f"{reference_seconds:>9.3f} {reference_seconds / seconds:>16.1f} {timeline.bubble_rate:>8.4f} "
              f"{ticks:>12}")
    verdict = "under" if slowest < BUDGET_SECONDS else "OVER"
    print(f"slowest pipeforge simulation {slowest:.3f} s: {verdict} the {BUDGET_SECONDS:g} s budget")
    return 0 if slowest < BUDGET_SECONDS else 1


if __name__ == "__main__":
    sys.exit(main())
