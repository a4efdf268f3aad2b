"""optimize with recompute and offload beside the knobs: Megatron's full recompute (``1f1b-recompute``), uniform policies.

Every row of the Zero Bubble paper's Table 5 (``zb_profiles.py``: T_F, T_B (I), T_W, T_comm, M_W / M_B;
R = F; a checkpoint of 0.05 M_B; OFFLOAD and RELOAD each as long as the stage's F, the most the issue
allows) at memory limits 0.5p, 0.75p and 1p M_B: 36 rows. Side by side in one run, each row:
``1f1b-recompute`` (every microbatch recomputed: Megatron's full recompute); the best uniform policy on
1F1B (every stage recomputes every k-th microbatch, k the largest that fits, or a smaller k where that
is faster); the best schedule without recompute that fits (``--recompute none``); ``optimize --recompute
auto`` with the ratio to full recompute, how far it is ahead of the uniform policy and of no recompute
(in %), what it chose and the seconds it took; the proven bound on any schedule of the work that may
recompute (``memory_actions.recompute_bound``) as a ratio to full recompute; and with ``--offload``, the
makespan with offload allowed over the one the row reaches with no memory limit. Numbers measured on a
shared machine are noise beyond the ratios of one run ("under load").

    python -m benchmarks.optimize.recompute [--rows N] [--fractions 0.5,0.75,1] [--time-limit S] [--offload]
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
from pipeforge.optimizer.memory_actions import optimize_memory, recompute_bound, uniform

CHECKPOINT = 0.05  # M_B: what a recomputed forward keeps (the issue's figure)
FRACTIONS = (0.5, 0.75, 1.0)


def uniform_best(schedule, costs, memory) -> tuple[float, int] | None:
    """The best uniform policy on 1F1B (``memory_actions.uniform``) as (makespan, k)."""
    found = uniform(schedule, costs, memory)
    return None if found is None else (pipeforge.simulate(found[0], costs).makespan, found[1])


def row_figures(row, fraction: float, time_limit: float, with_offload: bool) -> str:
    plain = pipeforge.load("1f1b", defines={"P": row.p, "M": row.m})
    full = pipeforge.load("1f1b-recompute", defines={"P": row.p, "M": row.m})
    limit = fraction * row.p
    memory = MemorySpec(limit, row.weights, checkpoint=CHECKPOINT)
    full_span = pipeforge.simulate(replace(full, memory=memory), row.costs).makespan
    uniform = uniform_best(plain, row.costs, memory)
    try:
        none, _ = optimize_memory(replace(plain, memory=memory), recompute="none", costs=row.costs,
                                  memory_limit=limit, time_limit=time_limit)
        none_span: float | None = none.after.makespan
    except PipeforgeError:
        none_span = None
    started = time.monotonic()
    auto, choice = optimize_memory(replace(plain, memory=memory), recompute="auto", costs=row.costs,
                                   memory_limit=limit, time_limit=time_limit)
    seconds = time.monotonic() - started
    _, bound = recompute_bound(plain, row.costs, memory)
    span = auto.after.makespan

    def ahead(other: float | None) -> str:
        return f"{'-':>7}" if other is None else f"{100 * (other - span) / other:6.1f}%"

    text = (f"{row.model:>6} {row.p:>3} {row.m:>4} {fraction:>5g}p {full_span:9.1f} "
            f"{'-' if uniform is None else f'{uniform[0]:.1f} k={uniform[1]}':>14} "
            f"{'-' if none_span is None else f'{none_span:.1f}':>9} {span:9.1f} {span / full_span:6.3f} "
            f"{ahead(uniform and uniform[0])} {ahead(none_span)} {bound / full_span:6.3f} "
            f"{choice.recompute:>14} {choice.recomputed:>5} {seconds:5.1f}")
    if with_offload:
        # no memory limit: every forward may be in flight (a limit of None would be the input's own peak)
        free, _ = optimize_memory(replace(plain, memory=replace(memory, limit=None)), costs=row.costs,
                                  memory_limit=float(row.m), time_limit=time_limit)
        try:
            off, off_choice = optimize_memory(replace(plain, memory=memory), recompute="none", offload=True,
                                              costs=row.costs, memory_limit=limit, time_limit=time_limit)
            offloaded = off.after.makespan / free.after.makespan
            text += f" {offloaded:6.3f} {off_choice.offloaded:>5}"
        except PipeforgeError:
            text += f" {'-':>6} {'-':>5}"
            offloaded = float("inf")
    else:
        offloaded = 1.0
    return text, span / full_span, uniform, none_span, span, seconds, time_limit, offloaded


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=len(TABLE_5))
    parser.add_argument("--fractions", default=",".join(f"{f:g}" for f in FRACTIONS))
    parser.add_argument("--time-limit", type=float, default=4.0)
    parser.add_argument("--offload", action="store_true", help="also the offload column (slower)")
    args = parser.parse_args()
    fractions = [float(f) for f in args.fractions.split(",")]
    print(f"load average {os.getloadavg()[0]:.1f} (numbers under load: read the ratios)")
    print(f"{'model':>6} {'p':>3} {'m':>4} {'limit':>6} {'full R':>9} {'uniform':>14} {'no R':>9} {'auto':>9} "
          f"{'/full':>6} {'>unif':>7} {'>noR':>7} {'bound':>6} {'chose':>14} {'R':>5} {'s':>5}"
          + (f" {'off/free':>6} {'offl':>5}" if args.offload else ""))
    missed = 0
    for row in TABLE_5[:args.rows]:
        for fraction in fractions:
            text, ratio, uniform, none_span, span, seconds, limit, offloaded = row_figures(
                row, fraction, args.time_limit, args.offload)
            print(text, flush=True)
            behind = (uniform is not None and span > uniform[0] + 1e-6) or (
                none_span is not None and span > none_span + 1e-6)
            missed += ratio > 0.9 or behind or seconds > limit or offloaded > 1.05
    print(f"rows where auto is above 0.9x full recompute, behind uniform or no recompute, or over the time "
          f"limit{', or offload is not within 5 % of no limit' if args.offload else ''}: {missed}")
    return 1 if missed else 0


if __name__ == "__main__":
    raise SystemExit(main())
