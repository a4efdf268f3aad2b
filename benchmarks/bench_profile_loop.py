"""The loop closed: profile a GPT with unequal stages, optimize from 1F1B at 1p memory, run, compare.

    .venv/bin/python benchmarks/bench_profile_loop.py                 # P=4, M=8, 10 measured steps
    .venv/bin/python benchmarks/bench_profile_loop.py --steps 20 --out /tmp/loop

1. ``pipeforge profile benchmarks/gpt_unequal.py --stages P`` writes the cost file
   (stage 0 holds the embedding, the last stage the LM head, each about as heavy
   as two blocks: stages cost about 4 : 2 : 2 : 4).
2. ``pipeforge optimize 1f1b --costs costs.json --memory-limit P`` (1p memory).
3. Every library schedule with P stages on P ranks, and the optimized one, is
   simulated with the cost file (the prediction) and run on P local gloo
   processes (``pipeforge.runtime.profiling.time_schedules``: the schedules take turns
   step by step, one torch thread a rank, the step time is the slowest rank's).
Reported: predicted and measured step time per schedule, measured / predicted,
the CPU time of a step summed over the ranks divided by its wall time (how many
cores the step kept busy: the simulator gives every rank a core of its own, so
when this reaches the machine's core count the bubbles it predicts are not
idle time but time another rank runs in), the rank correlation (Spearman) and
the mean relative error, whether the optimized schedule beats 1F1B and ZB-H1
in the prediction and in the measurement, and the load average before and after.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pipeforge.generator import codegen  # noqa: E402
from pipeforge.library import load_library_schedule, names  # noqa: E402
from pipeforge.inputs import load  # noqa: E402
from pipeforge.runtime.profiling import TimingJob  # noqa: E402
from pipeforge.runtime.launch import spawn  # noqa: E402
from pipeforge.sim import simulate  # noqa: E402
from pipeforge.sim.costfile import with_cost_file  # noqa: E402
from pipeforge.sim.costs import memory_for, resolve_costs  # noqa: E402

MODEL = ROOT / "benchmarks" / "gpt_unequal.py"


def pipeforge_cli(*argv: str) -> str:
    done = subprocess.run([sys.executable, "-m", "pipeforge", *argv], capture_output=True, text=True,
                          env={**__import__("os").environ, "PYTHONPATH": str(ROOT)})
    if done.returncode != 0:
        raise SystemExit(f"pipeforge {' '.join(argv)} failed ({done.returncode}):\n{done.stderr}")
    return done.stdout


def predicted(schedule, cost_path: Path) -> float:
    schedule = with_cost_file(schedule, cost_path)
    return simulate(schedule, resolve_costs(schedule, None), memory=memory_for(schedule, None)).makespan


def spearman(xs: list[float], ys: list[float]) -> float:
    def ranks(values):
        order = sorted(range(len(values)), key=values.__getitem__)
        out = [0.0] * len(values)
        for rank, index in enumerate(order):
            out[index] = float(rank)
        return out

    rx, ry = ranks(xs), ranks(ys)
    mx, my = statistics.mean(rx), statistics.mean(ry)
    cov = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    return cov / (sum((a - mx) ** 2 for a in rx) * sum((b - my) ** 2 for b in ry)) ** 0.5


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--microbatches", type=int, default=8)
    parser.add_argument("--steps", type=int, default=10, help="measured steps per schedule")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--profile-steps", type=int, default=5)
    parser.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                        help="how the profile times each action (pipeforge profile --clock)")
    parser.add_argument("--out", help="folder for costs.json, optimized.pipe and results.json (default: temporary)")
    args = parser.parse_args()
    out = Path(args.out or tempfile.mkdtemp(prefix="pipeforge-loop-"))
    out.mkdir(parents=True, exist_ok=True)
    P, M = args.ranks, args.microbatches
    costs, optimized = out / "costs.json", out / "optimized.pipe"
    load_before = os.getloadavg()
    print(f"{os.cpu_count()} cores; load average {' '.join(f'{x:.2f}' for x in load_before)}")

    print(pipeforge_cli("profile", str(MODEL), "--stages", str(P), "--microbatches", str(M),
                        "--steps", str(args.profile_steps), "--clock", args.clock, "-o", str(costs)))
    print(pipeforge_cli("optimize", "1f1b", "-D", f"P={P}", "-D", f"M={M}", "--costs", str(costs),
                        "--memory-limit", str(P), "-o", str(optimized)))

    schedules = {}
    for name in names():
        schedule = load_library_schedule(name, {"P": P, "M": M})
        if schedule.stages == P and schedule.ranks == P:
            schedules[name] = schedule
    schedules["optimized"] = load(str(optimized))
    with tempfile.TemporaryDirectory(prefix="pipeforge-loop-gen-") as gen:
        paths = []
        for index, (name, schedule) in enumerate(schedules.items()):
            folder = Path(gen) / f"s{index}"
            folder.mkdir()
            paths.append(str(codegen(schedule, str(folder))))
        job = TimingJob(str(MODEL), tuple(paths), steps=args.steps, warmup=args.warmup)
        outcomes = spawn("pipeforge.runtime.profiling:time_schedules", P, job, timeout=300.0,
                         deadline=60.0 + 10.0 * len(paths) * (args.steps + args.warmup) * 4)
    failed = [o for o in outcomes if not o.ok]
    if failed:
        raise SystemExit("\n".join(f"rank {o.rank}: {o.error}" for o in failed))
    measured, cpu = outcomes[0].value["ms"], outcomes[0].value["cpu_ms"]
    rows = []
    print(f"{'schedule':12}{'predicted ms':>14}{'measured ms':>13}{'meas/pred':>11}{'cores busy':>12}")
    for (name, schedule), ms, cpu_ms in zip(schedules.items(), measured, cpu):
        guess = predicted(schedule, costs)
        rows.append({"schedule": name, "predicted_ms": guess, "measured_ms": ms, "cpu_ms": cpu_ms})
        print(f"{name:12}{guess:>14.1f}{ms:>13.1f}{ms / guess:>11.3f}{cpu_ms / ms:>12.2f}")
    guesses = [r["predicted_ms"] for r in rows]
    times = [r["measured_ms"] for r in rows]
    rho = spearman(guesses, times)
    errors = [abs(t - g) / t for g, t in zip(guesses, times)]
    by = {r["schedule"]: r for r in rows}
    verdict = {
        "spearman": rho, "mean_relative_error": statistics.mean(errors), "max_relative_error": max(errors),
        "optimized_beats_1f1b_predicted": by["optimized"]["predicted_ms"] < by["1f1b"]["predicted_ms"],
        "optimized_beats_zbh1_predicted": by["optimized"]["predicted_ms"] < by["zb-h1"]["predicted_ms"],
        "optimized_beats_1f1b_measured": by["optimized"]["measured_ms"] < by["1f1b"]["measured_ms"],
        "optimized_beats_zbh1_measured": by["optimized"]["measured_ms"] < by["zb-h1"]["measured_ms"],
        "optimized_over_1f1b_measured": by["optimized"]["measured_ms"] / by["1f1b"]["measured_ms"],
        "optimized_over_zbh1_measured": by["optimized"]["measured_ms"] / by["zb-h1"]["measured_ms"],
    }
    print(f"rank correlation (Spearman) {rho:.3f}; relative error mean {verdict['mean_relative_error']:.1%}, "
          f"max {verdict['max_relative_error']:.1%}")
    print(f"optimized / 1f1b measured {verdict['optimized_over_1f1b_measured']:.3f}, "
          f"optimized / zb-h1 measured {verdict['optimized_over_zbh1_measured']:.3f}")
    load_after = os.getloadavg()
    print(f"load average before {' '.join(f'{x:.2f}' for x in load_before)}, "
          f"after {' '.join(f'{x:.2f}' for x in load_after)}")
    verdict = {**verdict, "cores": os.cpu_count(), "load_before": load_before, "load_after": load_after,
               "command": " ".join(sys.argv)}
    (out / "results.json").write_text(json.dumps({"rows": rows, **verdict}, indent=2) + "\n")
    print(f"wrote {out / 'results.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
