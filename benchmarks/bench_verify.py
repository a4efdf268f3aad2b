"""pipeforge lower + verify (z3 certificate) beside torch's _add_send_recv + _simulate_comms_compute.

Both sides start from the same compute-only order: torch's ScheduleInterleaved1F1B
pipeline_order, built with stand-in stages and no process group. torch inserts its
sends and receives and dry-runs them; pipeforge lowers the order into send/recv
groups and proves it deadlock-free with a timing that z3 checks.

    .venv/bin/python benchmarks/bench_verify.py            # 32x128x2 side by side, 64x256x2, growth
    .venv/bin/python benchmarks/bench_verify.py --quick    # smaller sizes
"""

from __future__ import annotations

import argparse
import copy
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from torch.distributed.pipelining import schedules as torch_schedules  # noqa: E402

from pipeforge.ir import Placement, Schedule, programs_from_tokens  # noqa: E402
from pipeforge.verify import verify  # noqa: E402
from tests.torch_stages import build_torch_schedule  # noqa: E402


def torch_order(ranks: int, microbatches: int, per_rank: int) -> dict[int, list]:
    return build_torch_schedule("ScheduleInterleaved1F1B", ranks, microbatches, per_rank).pipeline_order


def as_schedule(order: dict[int, list], ranks: int, microbatches: int, per_rank: int) -> Schedule:
    stages = ranks * per_rank
    rows = [[str(a) if a is not None else "_" for a in order[rank]] for rank in range(ranks)]
    return Schedule("interleaved_1f1b", ranks, stages, microbatches, (Placement.loop(stages, ranks),),
                    programs_from_tokens(rows))


def time_torch(order: dict[int, list], ranks: int, per_rank: int) -> float:
    stages = ranks * per_rank
    compute = copy.deepcopy({r: [a for a in order[r] if a is not None] for r in order})
    started = time.perf_counter()
    with_comms = torch_schedules._add_send_recv(compute, lambda s: s % ranks, stages)
    torch_schedules._simulate_comms_compute(with_comms, lambda s: s % ranks, stages)
    return time.perf_counter() - started


def time_pipeforge(schedule: Schedule) -> tuple[float, object]:
    started = time.perf_counter()
    report = verify(schedule)  # a compute-only schedule is verified as lower makes it: lowering included
    elapsed = time.perf_counter() - started
    if not report.valid or not report.certified:
        raise SystemExit(f"pipeforge did not certify the schedule:\n{report.render()}")
    return elapsed, report


def side_by_side(ranks: int, microbatches: int, per_rank: int, repeats: int) -> None:
    """Best of ``repeats`` interleaved runs of each side (the machine is shared: minima are stable)."""
    order = torch_order(ranks, microbatches, per_rank)
    schedule = as_schedule(order, ranks, microbatches, per_rank)
    ours, theirs = [], []
    for _ in range(repeats):
        elapsed, report = time_pipeforge(schedule)
        ours.append(elapsed)
        theirs.append(time_torch(order, ranks, per_rank))
    print(f"{ranks} ranks x {microbatches} mb x {per_rank} stages/rank ({report.stats.steps} steps), "
          f"best of {repeats}: pipeforge lower+verify+z3 {min(ours):.2f} s | torch "
          f"_add_send_recv+_simulate_comms_compute {min(theirs):.2f} s | ratio {min(ours) / min(theirs):.3f} "
          f"(must be <= 1)")


def alone(ranks: int, microbatches: int, per_rank: int, budget: float | None = None, beside_torch: bool = False) -> None:
    order = torch_order(ranks, microbatches, per_rank)
    ours, report = time_pipeforge(as_schedule(order, ranks, microbatches, per_rank))
    steps = report.stats.steps
    verdict = "" if budget is None else f" (budget {budget:g} s: {'ok' if ours <= budget else 'OVER'})"
    torch_text = ""
    if beside_torch:
        theirs = time_torch(order, ranks, per_rank)
        torch_text = f" | torch {theirs:.2f} s, ratio {ours / theirs:.3f}"
    print(f"{ranks} ranks x {microbatches} mb x {per_rank} stages/rank: {steps} steps, "
          f"{ours:.2f} s, {1e6 * ours / steps:.1f} us/step{verdict}{torch_text}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller sizes (a smoke run)")
    args = parser.parse_args()
    if args.quick:
        side_by_side(8, 32, 2, repeats=1)
        for ranks, mbs in ((4, 16), (8, 32), (16, 64)):
            alone(ranks, mbs, 2)
        return
    side_by_side(32, 128, 2, repeats=3)
    alone(64, 256, 2, budget=10.0)
    print("growth with the number of steps (one run each, torch beside):")
    for ranks, mbs in ((8, 32), (16, 64), (32, 128), (64, 256)):
        alone(ranks, mbs, 2, beside_torch=True)


if __name__ == "__main__":
    main()
