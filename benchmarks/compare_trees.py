"""Run benchmark scripts from two source trees alternately, in one run, and report the ratios.

    python benchmarks/compare_trees.py BEFORE_TREE AFTER_TREE [--rounds 2] [--only bench_simulate ...]
        [--args bench_verify=--quick ...]

Each round runs every bench script from BEFORE_TREE then from AFTER_TREE (each
with ``PYTHONPATH`` set to its tree and its own copy of the script), so load on
a shared machine falls on both alike. For each run it records the child's CPU
time (user + system, which a loaded machine disturbs less than wall time) and
the wall time, and keeps each tree's best. It prints, per bench, the best CPU
and wall time of each tree and after / before; then the last output of each,
so the benches' own figures (pipeforge's times beside torch's) can be compared
(``--stream``: each run's output as soon as it ends).
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

BENCHES = ("bench_csv", "bench_parse", "bench_simulate", "bench_verify", "bench_library", "bench_zb_table5",
           "bench_optimize", "bench_runtime")


def run_once(tree: Path, bench: str, extra: list[str], timeout: float) -> tuple[float, float, int, str]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    try:
        done = subprocess.run([sys.executable, str(tree / "benchmarks" / f"{bench}.py"), *extra], cwd=tree, env=env,
                              capture_output=True, text=True, timeout=timeout)
        code, output = done.returncode, done.stdout + done.stderr
    except subprocess.TimeoutExpired as expired:
        code, output = -1, f"timed out after {timeout} s\n{expired.stdout or ''}"
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return cpu, wall, code, output


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("before", type=Path)
    parser.add_argument("after", type=Path)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--only", nargs="*", default=list(BENCHES))
    parser.add_argument("--args", nargs="*", default=[], metavar="BENCH=ARGS", help="extra arguments of one bench")
    parser.add_argument("--timeout", type=float, default=1800.0)
    parser.add_argument("--stream", action="store_true", help="print each run's output as it ends")
    options = parser.parse_args()
    extra = {key: value.split() for key, _, value in (item.partition("=") for item in options.args)}
    best: dict[tuple[str, str], list[float]] = {}
    last: dict[tuple[str, str], tuple[int, str]] = {}
    for round_no in range(options.rounds):
        for bench in options.only:
            for label, tree in (("before", options.before), ("after", options.after)):
                cpu, wall, code, output = run_once(tree.resolve(), bench, extra.get(bench, []), options.timeout)
                print(f"round {round_no} {bench} {label}: cpu {cpu:.2f} s wall {wall:.2f} s exit {code}", flush=True)
                if options.stream:
                    print(output.rstrip(), flush=True)
                kept = best.setdefault((bench, label), [float("inf"), float("inf")])
                kept[0], kept[1] = min(kept[0], cpu), min(kept[1], wall)
                last[(bench, label)] = (code, output)
    print(f"\n{'bench':18} {'cpu before':>11} {'cpu after':>10} {'ratio':>6} {'wall before':>12} {'wall after':>11} {'ratio':>6}")
    for bench in options.only:
        (cb, wb), (ca, wa) = best[(bench, "before")], best[(bench, "after")]
        print(f"{bench:18} {cb:11.2f} {ca:10.2f} {ca / cb:6.3f} {wb:12.2f} {wa:11.2f} {wa / wb:6.3f}")
    for bench in options.only:
        for label in ("before", "after"):
            code, output = last[(bench, label)]
            print(f"\n===== {bench} {label} (exit {code}) =====\n{output.rstrip()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
