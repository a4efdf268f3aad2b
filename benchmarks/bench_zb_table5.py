"""The Zero Bubble paper's Table 5 bubble rates, beside pipeforge's simulation of the same schedules.

Inputs (the paper's profiled 1.5B model, p = 8): T_F = 18.522, T_B = 18.086,
T_W = 9.337, T_comm = 0.601. The paper's T_B is the input-gradient time, which
is pipeforge's I; a full backward B = I + W. Its bubble rate is the one
pipeforge reports: per rank, span = end of last compute - start of first
compute, busy = sum of compute; bubble = 1 - mean(busy) / max(span), with
T_comm added on every cross-rank data edge (F(s) -> F(s+1), B/I(s+1) -> B/I(s)).
The schedules are the library's ``1f1b``, ``zb-h1`` and ``zb-h2``.

    .venv/bin/python benchmarks/bench_zb_table5.py

Beside each rate: the makespan, pipeforge's lower bound with unlimited memory,
the peak memory, and the bounds for any order keeping that same peak as limit.

Exits 1 when any rate is more than 0.002 from the paper's.
"""

from __future__ import annotations

import sys

import pipeforge
from pipeforge.ir import CostModel, MemorySpec
from pipeforge.sim import simulate

COSTS = CostModel(F=18.522, I=18.086, W=9.337, comm=0.601)
RANKS = 8
PAPER = {  # (schedule, microbatches) -> the paper's Table 5 bubble rate
    ("1f1b", 24): 0.2431, ("1f1b", 32): 0.1985,
    ("zb-h1", 24): 0.1585, ("zb-h1", 32): 0.1242,
    ("zb-h2", 24): 0.1083, ("zb-h2", 32): 0.0837,
}
TOLERANCE = 0.002


def main() -> int:
    print(f"{'schedule':<8} {'m':>3} {'paper':>8} {'pipeforge':>10} {'diff':>8} {'makespan':>10} "
          f"{'bound':>10} {'peak M_B':>9} {'bound@peak':>11} {'bubble bound@peak':>18}")
    worst = 0.0
    for (name, microbatches), paper_rate in PAPER.items():
        schedule = pipeforge.load(name, defines={"P": RANKS, "M": microbatches})
        timeline = simulate(schedule, COSTS)
        peak = max(timeline.peak_memory)
        limited = simulate(schedule, COSTS, memory=MemorySpec(limit=peak))
        diff = timeline.bubble_rate - paper_rate
        worst = max(worst, abs(diff))
        print(f"{name:<8} {microbatches:>3} {paper_rate:>8.4f} {timeline.bubble_rate:>10.4f} {diff:>+8.4f} "
              f"{timeline.makespan:>10.2f} {timeline.lower_bound:>10.2f} {peak:>9g} "
              f"{limited.lower_bound:>11.2f} {limited.bubble_lower_bound:>18.4f}")
    verdict = "within" if worst <= TOLERANCE else "OUTSIDE"
    print(f"largest |difference| {worst:.4f}: {verdict} the tolerance {TOLERANCE}")
    return 0 if worst <= TOLERANCE else 1


if __name__ == "__main__":
    sys.exit(main())
