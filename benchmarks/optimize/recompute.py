"""optimize with recompute beside the knobs: Megatron's full recompute (``1f1b-recompute``) and uniform policies.

Every row of the Zero Bubble paper's Table 5 (``zb_profiles.py``: T_F, T_B (I), T_W, T_comm, M_W / M_B;
R = F; a checkpoint of 0.05 M_B) at memory limits 0.5p, 0.75p and 1p M_B. Side by side in one run, each
row: ``1f1b-recompute`` (every microbatch recomputed: Megatron's full recompute), the best uniform policy
(stage s recomputes every k-th microbatch, k the largest, i.e. the least recompute, that fits), the best
schedule without recompute that fits (``optimize --recompute none``), and ``optimize --recompute auto``
with what it chose and the time it took. Ratios are of makespans (ms); numbers measured on a shared
machine are noise beyond the ratios of one run ("under load"). ``--rows N`` runs the first N rows only.

    python -m benchmarks.optimize.recompute [--rows N] [--time-limit S]
"""

from __future__ import annotations

import argparse
import os
import time
from dataclasses import replace

import pipeforge
from benchmarks.zb_profiles import TABLE_5
from pipeforge.errors import PipeforgeError
from pipeforge.ir import MemorySpec
from pipeforge.optimizer.memory_actions import optimize_memory
from pipeforge.passes.recompute import recompute
from pipeforge.verifier import verify

CHECKPOINT = 0.05  # M_B: what a recomputed forward keeps (the issue's figure)
FRACTIONS = (0.5, 0.75, 1.0)


def uniform_best(schedule, costs, memory):
    """The least recompute of the form "every k-th microbatch on every stage" whose 1F1B order fits."""
    best = None
    for k in range(schedule.microbatches, 0, -1):
        which = [(s, m, 0) for s in range(schedule.stages) for m in range(schedule.microbatches) if m % k == 0]
        candidate = replace(recompute(schedule, which), memory=memory)
        if verify(candidate).valid:
            timeline = pipeforge.simulate(candidate, costs)
            if best is None or timeline.makespan < best[0]:
                best = (timeline.makespan, k)
    return best


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=len(TABLE_5))
    parser.add_argument("--time-limit", type=float, default=10.0)
    args = parser.parse_args()
    print(f"load average {os.getloadavg()[0]:.1f} (numbers under load: read the ratios)")
    print(f"{'model':>6} {'p':>3} {'m':>4} {'limit':>6} {'full R':>9} {'uniform':>12} {'no R':>9} {'auto':>9} "
          f"{'auto/full':>9} {'R':>5} {'off':>4} {'s':>5}")
    worse = 0
    for row in TABLE_5[:args.rows]:
        plain = pipeforge.load("1f1b", defines={"P": row.p, "M": row.m})
        full = pipeforge.load("1f1b-recompute", defines={"P": row.p, "M": row.m})
        for fraction in FRACTIONS:
            limit = fraction * row.p
            memory = MemorySpec(limit, row.weights, checkpoint=CHECKPOINT)
            full_span = pipeforge.simulate(replace(full, memory=memory), row.costs).makespan
            fits = verify(replace(full, memory=memory)).valid
            uniform = uniform_best(plain, row.costs, memory)
            started = time.monotonic()
            try:
                none, _ = optimize_memory(replace(plain, memory=memory), recompute="none", costs=row.costs,
                                          memory_limit=limit, time_limit=args.time_limit / 2)
                none_span = f"{none.after.makespan:9.1f}"
            except PipeforgeError:
                none_span = f"{'-':>9}"
            try:
                auto, choice = optimize_memory(replace(plain, memory=memory), recompute="auto", costs=row.costs,
                                               memory_limit=limit, time_limit=args.time_limit)
            except PipeforgeError as error:
                print(f"{row.model:>6} {row.p:>3} {row.m:>4} {limit:>6g}: {str(error)[:90]}")
                continue
            seconds = time.monotonic() - started
            ratio = auto.after.makespan / full_span
            worse += ratio > 0.9 or (uniform is not None and auto.after.makespan > uniform[0] + 1e-9)
            uniform_text = f"{uniform[0]:8.1f} k={uniform[1]}" if uniform else f"{'-':>12}"
            print(f"{row.model:>6} {row.p:>3} {row.m:>4} {limit:>6g} {full_span:9.1f}{'' if fits else '!'} "
                  f"{uniform_text:>12} {none_span} {auto.after.makespan:9.1f} {ratio:9.3f} {choice.recomputed:>5} "
                  f"{choice.offloaded:>4} {seconds:5.1f}")
    print(f"rows where auto is not at most 0.9x full recompute, or behind the best uniform policy: {worse}")
    return 1 if worse else 0


if __name__ == "__main__":
    raise SystemExit(main())
