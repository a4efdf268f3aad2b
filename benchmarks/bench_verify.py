"""pipeforge verify beside torch's own dry run, from the same compute-only order.

torch's ScheduleInterleaved1F1B pipeline_order is built with stand-in stages (no
process group). torch's side, in process: ``_add_send_recv`` (insert its sends and
receives) + ``_simulate_comms_compute`` (dry-run them). pipeforge's side, as a user
runs it: the whole ``pipeforge verify FILE.csv`` process (start-up, reading the
CSV, lowering it into send/recv groups, the checks, z3), once with the default and
once with ``--solve`` (z3 decides the timing, order and completeness models with
free variables). Each side is timed in CPU seconds (the machine may be shared:
CPU time is what the work costs) and wall seconds; the ratios are pipeforge/torch.
pipeforge's modules are byte-compiled first, into a temporary cache, as an
installed package's are (with PYTHONDONTWRITEBYTECODE set, as in some shells,
every process would compile them again: about 0.03 s of each run).

    .venv/bin/python benchmarks/bench_verify.py            # 16x64x2, 32x128x2, 64x256x2 (one run each)
    .venv/bin/python benchmarks/bench_verify.py --quick    # 8x32x2 and 16x64x2
"""

from __future__ import annotations

import argparse
import copy
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from torch.distributed.pipelining import schedules as torch_schedules  # noqa: E402

from tests.torch_stages import build_torch_schedule  # noqa: E402

TARGET_RATIO = 0.7  # whole-process verify vs torch's in-process dry run, at 32 x 128 x 2
SOLVE_BUDGET_S = 10.0  # whole-process verify --solve at 64 x 256 x 2


def torch_dry_run(order: dict[int, list], ranks: int, per_rank: int) -> tuple[float, float]:
    stages = ranks * per_rank
    compute = copy.deepcopy({r: [a for a in order[r] if a is not None] for r in order})
    cpu, wall = time.process_time(), time.perf_counter()
    with_comms = torch_schedules._add_send_recv(compute, lambda s: s % ranks, stages)
    torch_schedules._simulate_comms_compute(with_comms, lambda s: s % ranks, stages)
    return time.process_time() - cpu, time.perf_counter() - wall


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


def pipeforge_process(csv: Path, env: dict[str, str], *flags: str) -> tuple[float, float, str]:
    """CPU and wall seconds of one whole ``pipeforge verify`` process, and its verdict line."""
    cpu, wall = children_cpu(), time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "pipeforge", "verify", str(csv), *flags], env=env,
                          capture_output=True, text=True)
    elapsed = time.perf_counter() - wall, children_cpu() - cpu
    if done.returncode != 0:
        raise SystemExit(f"pipeforge verify {csv} {' '.join(flags)} exited {done.returncode}:\n"
                         f"{done.stdout}{done.stderr}")
    return elapsed[1], elapsed[0], done.stdout.splitlines()[0]


def compare(ranks: int, microbatches: int, per_rank: int, folder: Path, env: dict[str, str]) -> None:
    schedule = build_torch_schedule("ScheduleInterleaved1F1B", ranks, microbatches, per_rank)
    csv = folder / f"interleaved_{ranks}x{microbatches}x{per_rank}.csv"
    schedule._dump_csv(str(csv), format="compute_only")
    theirs_cpu, theirs_wall = torch_dry_run(schedule.pipeline_order, ranks, per_rank)
    size = f"{ranks}x{microbatches}x{per_rank}"
    print(f"{size:10s} torch _add_send_recv+_simulate_comms_compute (in process): "
          f"{theirs_cpu:6.2f} s CPU {theirs_wall:6.2f} s wall", flush=True)
    for flags in ((), ("--solve",)):
        cpu, wall, verdict = pipeforge_process(csv, env, *flags)
        name = "pipeforge verify " + (" ".join(flags) or "(default)")
        note = ""
        if (ranks, microbatches, per_rank) == (32, 128, 2) and not flags:
            note = f"  target <= {TARGET_RATIO}: {'met' if cpu / theirs_cpu <= TARGET_RATIO else 'NOT met'}"
        if (ranks, microbatches, per_rank) == (64, 256, 2) and flags:
            note = f"  budget {SOLVE_BUDGET_S:g} s: {'met' if wall <= SOLVE_BUDGET_S else 'NOT met'} (wall)"
        print(f"{size:10s} {name:34s} (whole process): {cpu:6.2f} s CPU {wall:6.2f} s wall | "
              f"ratio CPU {cpu / theirs_cpu:5.2f} wall {wall / theirs_wall:5.2f}{note}   [{verdict[:60]}]",
              flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller sizes (a smoke run)")
    args = parser.parse_args()
    sizes = ((8, 32, 2), (16, 64, 2)) if args.quick else ((16, 64, 2), (32, 128, 2), (64, 256, 2))
    print(f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())} ({os.cpu_count()} CPUs)", flush=True)
    with tempfile.TemporaryDirectory() as folder:
        env = process_environment(Path(folder))
        for ranks, microbatches, per_rank in sizes:
            compare(ranks, microbatches, per_rank, Path(folder), env)
    print(f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())} (after)", flush=True)


if __name__ == "__main__":
    main()
