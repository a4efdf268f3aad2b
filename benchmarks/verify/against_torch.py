"""pipeforge verify beside torch's own dry run, from the same compute-only order.

torch's ScheduleInterleaved1F1B pipeline_order is built with stand-in stages (no
process group). torch's side, in process: ``_add_send_recv`` (insert its sends and
receives) + ``_simulate_comms_compute`` (dry-run them), each run on a fresh copy of
the order. pipeforge's side, as a user runs it: the whole ``pipeforge verify
FILE.csv`` process (start-up, reading the CSV, lowering it into send/recv groups,
the checks, z3), once with the default and once with ``--solve`` (z3 decides the
timing, order and completeness models with free variables), each run a process of
its own. Each side is timed in CPU seconds (the machine may be shared: CPU time is
what the work costs) and wall seconds.

The machine's load makes single runs vary by a quarter, so each side runs
``--repeat`` times, the three interleaved (torch, verify, verify --solve, then again),
and the report gives the median and the least of each; the ratios are
pipeforge/torch of the medians (the least in brackets). pipeforge's modules are
byte-compiled first, into a temporary cache, as an installed package's are (with
PYTHONDONTWRITEBYTECODE set, as in some shells, every process would compile them
again: about 0.03 s of each run).

    python -m benchmarks.verify.against_torch              # 16x64x2, 32x128x2, 64x256x2, 5 runs each
    python -m benchmarks.verify.against_torch --repeat 3   # fewer runs
    python -m benchmarks.verify.against_torch --quick      # 8x32x2 and 16x64x2
"""

from __future__ import annotations

import argparse
import copy
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import NamedTuple

from torch.distributed.pipelining import schedules as torch_schedules

from tests.torch_stages import build_torch_schedule

ROOT = Path(__file__).resolve().parents[2]

TARGET_RATIO = 0.7  # whole-process verify vs torch's in-process dry run, at 32 x 128 x 2 (CPU, medians)
SOLVE_BUDGET_S = 10.0  # whole-process verify --solve at 64 x 256 x 2 (wall, median)


class Run(NamedTuple):
    cpu: float
    wall: float


class Runs(NamedTuple):
    """One side's runs at one size."""

    runs: tuple[Run, ...]

    def median(self, field: str) -> float:
        return statistics.median(getattr(run, field) for run in self.runs)

    def least(self, field: str) -> float:
        return min(getattr(run, field) for run in self.runs)


def torch_dry_run(order: dict[int, list], ranks: int, per_rank: int) -> Run:
    stages = ranks * per_rank
    compute = copy.deepcopy({r: [a for a in order[r] if a is not None] for r in order})
    cpu, wall = time.process_time(), time.perf_counter()
    with_comms = torch_schedules._add_send_recv(compute, lambda s: s % ranks, stages)
    torch_schedules._simulate_comms_compute(with_comms, lambda s: s % ranks, stages)
    return Run(time.process_time() - cpu, time.perf_counter() - wall)


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def process_environment(folder: Path) -> dict[str, str]:
    """PYTHONPATH at this tree, and a byte-code cache in ``folder`` filled before anything is timed."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), PYTHONPYCACHEPREFIX=str(folder / "pycache"))
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(ROOT / "pipeforge")], env=env, check=True,
                   capture_output=True)
    return env


def pipeforge_process(csv: Path, env: dict[str, str], *flags: str) -> tuple[Run, str]:
    """CPU and wall seconds of one whole ``pipeforge verify`` process, and its verdict line."""
    cpu, wall = children_cpu(), time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "pipeforge", "verify", str(csv), *flags], env=env,
                          capture_output=True, text=True)
    run = Run(children_cpu() - cpu, time.perf_counter() - wall)
    if done.returncode != 0:
        raise SystemExit(f"pipeforge verify {csv} {' '.join(flags)} exited {done.returncode}:\n"
                         f"{done.stdout}{done.stderr}")
    return run, done.stdout.splitlines()[0]


FLAGS = ((), ("--solve",))


def compare(ranks: int, microbatches: int, per_rank: int, folder: Path, env: dict[str, str], repeat: int) -> None:
    schedule = build_torch_schedule("ScheduleInterleaved1F1B", ranks, microbatches, per_rank)
    csv = folder / f"interleaved_{ranks}x{microbatches}x{per_rank}.csv"
    schedule._dump_csv(str(csv), format="compute_only")
    theirs: list[Run] = []
    ours: dict[tuple[str, ...], list[Run]] = {flags: [] for flags in FLAGS}
    verdicts: dict[tuple[str, ...], str] = {}
    for _ in range(repeat):  # interleaved, so that a change in the machine's load touches every side alike
        theirs.append(torch_dry_run(schedule.pipeline_order, ranks, per_rank))
        for flags in FLAGS:
            run, verdicts[flags] = pipeforge_process(csv, env, *flags)
            ours[flags].append(run)
    report(f"{ranks}x{microbatches}x{per_rank}", (ranks, microbatches, per_rank), Runs(tuple(theirs)),
           {flags: Runs(tuple(runs)) for flags, runs in ours.items()}, verdicts)


def seconds(runs: Runs) -> str:
    return (f"CPU {runs.median('cpu'):5.2f} s (least {runs.least('cpu'):5.2f}) "
            f"wall {runs.median('wall'):5.2f} s (least {runs.least('wall'):5.2f})")


def report(size: str, shape: tuple[int, int, int], theirs: Runs, ours: dict[tuple[str, ...], Runs],
           verdicts: dict[tuple[str, ...], str]) -> None:
    name = "torch _add_send_recv+_simulate_comms_compute (in process)"
    print(f"{size:10s} {name:58s} {seconds(theirs)}", flush=True)
    for flags, runs in ours.items():
        ratio = runs.median("cpu") / theirs.median("cpu")
        least = runs.least("cpu") / theirs.least("cpu")
        wall = runs.median("wall") / theirs.median("wall")
        note = ""
        if shape == (32, 128, 2) and not flags:
            note = f"  target <= {TARGET_RATIO}: {'met' if ratio <= TARGET_RATIO else 'NOT met'}"
        if shape == (64, 256, 2) and flags:
            met = runs.median("wall") <= SOLVE_BUDGET_S
            note = f"  budget {SOLVE_BUDGET_S:g} s: {'met' if met else 'NOT met'} (wall)"
        name = "pipeforge verify " + (" ".join(flags) or "(default)") + " (whole process)"
        print(f"{size:10s} {name:58s} {seconds(runs)} | ratio CPU {ratio:4.2f} (least {least:4.2f}) "
              f"wall {wall:4.2f}{note}   [{verdicts[flags][:60]}]", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller sizes (a smoke run)")
    parser.add_argument("--repeat", type=int, default=5, help="runs of each side at each size (default 5)")
    args = parser.parse_args()
    if args.repeat < 1:
        parser.error("--repeat must be at least 1")
    sizes = ((8, 32, 2), (16, 64, 2)) if args.quick else ((16, 64, 2), (32, 128, 2), (64, 256, 2))
    print(f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())} ({os.cpu_count()} CPUs); "
          f"{args.repeat} runs of each side, medians (least)", flush=True)
    with tempfile.TemporaryDirectory() as folder:
        env = process_environment(Path(folder))
        for ranks, microbatches, per_rank in sizes:
            compare(ranks, microbatches, per_rank, Path(folder), env, args.repeat)
    print(f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())} (after)", flush=True)


if __name__ == "__main__":
    main()
