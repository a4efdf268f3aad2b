"""Reading a torch schedule CSV: pipeforge's strict reader against torch's own ``_load_csv``.

The CSV is written by torch: interleaved 1F1B, 32 ranks x 128 microbatches x 2
stages per rank (32 rows, 512 cells each), compute-only and with communication.
Only the load is timed (best of several runs):

- pipeforge: ``read_csv`` (strict parse with spans, stage/microbatch/placement inference);
- torch parse: ``PipelineScheduleMulti._load_csv`` (regex parse + ``_validate_schedule``);
- torch load: the schedule's own ``_load_csv`` (the above, then torch lowers the
  compute-only form to its runtime form; for compute_comms it only parses).

    python -m benchmarks.load.read_csv
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

from torch.distributed.pipelining.schedules import PipelineScheduleMulti

from pipeforge.interop.torch_csv import read_csv
from tests.torch_stages import build_torch_schedule

RANKS, MICROBATCHES, PER_RANK = 32, 128, 2


def best_of(runs: int, load) -> float:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        load()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    torch_schedule = build_torch_schedule("ScheduleInterleaved1F1B", RANKS, MICROBATCHES, PER_RANK)
    print(f"interleaved 1F1B: {RANKS} ranks x {MICROBATCHES} microbatches x {PER_RANK} stages/rank")
    with tempfile.TemporaryDirectory() as folder:
        for form in ("compute_only", "compute_comms"):
            path = Path(folder) / f"{form}.csv"
            torch_schedule._dump_csv(str(path), format=form)
            ours = best_of(5, lambda: read_csv(path))
            parse = best_of(5, lambda: PipelineScheduleMulti._load_csv(torch_schedule, str(path)))
            full = best_of(3, lambda: torch_schedule._load_csv(str(path), format=form))
            cells = sum(len(line.split(",")) for line in path.read_text().splitlines())
            print(f"{form:14s} {cells:6d} cells  pipeforge {ours * 1e3:7.1f} ms   "
                  f"torch parse {parse * 1e3:7.1f} ms ({ours / parse:4.2f}x)   "
                  f"torch _load_csv {full * 1e3:7.1f} ms ({ours / full:4.2f}x)")
            verdict = "within" if ours < 0.5 else "OVER"
            print(f"{'':14s} pipeforge {verdict} the budget (well under 1 s: 0.5 s here)")


if __name__ == "__main__":
    main()
