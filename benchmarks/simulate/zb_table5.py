"""The Zero Bubble paper's Table 5 bubble rates, beside pipeforge's simulation of the same schedules.

Every row with the profile the paper measured for that very row (``zb_profiles.py``:
T_F, T_B, T_W, T_comm per model, p and m; M_W / M_B = 0.366 for 1.5B, 0.432 for
the others). The paper's T_B is the input-gradient time, which is pipeforge's
I; a full backward B = I + W. Its bubble rate is the one pipeforge reports: per
rank, span = end of last compute - start of first compute, busy = sum of
compute; bubble = 1 - mean(busy) / max(span), with T_comm added on every
cross-rank data edge. The schedules are the library's ``1f1b``, ``zb-h1`` and
``zb-h2``; the paper's ZB-H1 / ZB-H2 are compared where ``zb_profiles`` has
them.

    python -m benchmarks.simulate.zb_table5

Beside each rate: the makespan, the peak memory (M_B, with the row's M_W / M_B),
and pipeforge's bound on the bubble rate for any order keeping that peak.

Exits 1 when any rate is more than 0.002 from the paper's.
"""

from __future__ import annotations

import sys

import pipeforge
from benchmarks.zb_profiles import TABLE_5
from pipeforge.ir import MemorySpec
from pipeforge.sim import simulate

TOLERANCE = 0.002


def main() -> int:
    print(f"{'model':<6}{'p':>3}{'m':>4}  {'schedule':<7}{'paper':>8}{'pipeforge':>10}{'diff':>8}{'makespan':>10}"
          f"{'peak M_B':>9}{'bubble bound@peak':>18}")
    worst = 0.0
    for row in TABLE_5:
        for name, paper in (("1f1b", row.one_f_one_b), ("zb-h1", row.zb_h1), ("zb-h2", row.zb_h2)):
            schedule = pipeforge.load(name, defines={"P": row.p, "M": row.m})
            timeline = simulate(schedule, row.costs, memory=MemorySpec(weights=row.weights))
            peak = max(timeline.peak_memory)
            limited = simulate(schedule, row.costs, memory=MemorySpec(limit=peak, weights=row.weights))
            diff = "-" if paper is None else f"{timeline.bubble_rate - paper:+.4f}"
            worst = worst if paper is None else max(worst, abs(timeline.bubble_rate - paper))
            print(f"{row.model:<6}{row.p:>3}{row.m:>4}  {name:<7}{'-' if paper is None else f'{paper:.4f}':>8}"
                  f"{timeline.bubble_rate:>10.4f}{diff:>8}{timeline.makespan:>10.2f}{peak:>9.3g}"
                  f"{limited.bubble_lower_bound:>18.4f}")
    verdict = "within" if worst <= TOLERANCE else "OUTSIDE"
    print(f"largest |difference| {worst:.4f}: {verdict} the tolerance {TOLERANCE}")
    return 0 if worst <= TOLERANCE else 1


if __name__ == "__main__":
    sys.exit(main())
