"""What the per-step failure protocol costs: one pipeline's steps with it as it runs, as it ran, and without it.

    python -m benchmarks.runtime.step_end                 # 1F1B, 2 and 4 gloo processes, M = 8
    python -m benchmarks.runtime.step_end --steps 200

Every ``step()`` ends with an agreement (one word per rank, on a gloo group of its own) on whether it
failed on any rank (``pipeforge.runtime.recovery.StepStart.end``), so no rank returns normally from a
step that failed elsewhere; a step that follows one whose agreement heard every rank's step run starts
without a greeting (``StepStart.begin``), one that follows a call without the agreement greets its
neighbours first. On every rank one pipeline of the tiny demo MLP (width 4: per-step overhead, not
compute) runs steps in triples, each after a barrier, ``pipe.end_agreement`` False, True, True: the
first (after an agreed step) is a bare step, neither greeting nor agreement; the second (after one
without the agreement) greets and agrees, as every step did before; the third (after an agreed step)
agrees only, as every step does now. A step's time is the slowest rank's; the row shows the medians,
the median per-triple differences from the bare step, and their ratio, and the same differences of the
main threads' CPU time summed over the ranks.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import pipeforge
from benchmarks.runtime._harness import load_average
from pipeforge.generator import codegen
from pipeforge.tools.launch import spawn

KINDS = ("bare", "both", "agreement")  # one triple's steps, in the order they run (each follows the one before)
AGREES = {"bare": False, "both": True, "agreement": True}


def ranks_job(rank: int, nproc: int, job: dict) -> dict:
    import torch.distributed as dist

    from pipeforge.tools import demo_models as models
    from pipeforge.tools.generated import load_module

    generated = load_module(job["path"])
    info = generated.SCHEDULE
    full = models.build_stages("mlp", info.stages, seed=0)
    pipe = generated.make_pipeline({s: full[s] for s in info.stages_of(rank)}, loss_fn=models.loss_fn, timeout=60)
    x, y = models.make_batch(info.stages, 2 * info.microbatches, seed=0)
    times: dict[str, list[float]] = {kind: [] for kind in KINDS}
    cpu: dict[str, list[float]] = {kind: [] for kind in KINDS}
    pipe.step(*((x,) if pipe.holds_first else ()), target=y if pipe.holds_last else None)  # agreed: no greeting next
    for index in range(job["warmup"] + job["steps"]):
        for kind in KINDS:
            pipe.end_agreement = AGREES[kind]
            dist.barrier()
            started, cpu_started = time.perf_counter(), time.thread_time()
            pipe.step(*((x,) if pipe.holds_first else ()), target=y if pipe.holds_last else None)
            if index >= job["warmup"]:
                times[kind].append(time.perf_counter() - started)
                cpu[kind].append(time.thread_time() - cpu_started)
    return {"times": times, "cpu": cpu}


def row(nproc: int, records: list[dict]) -> str:
    count = len(records[0]["times"]["bare"])
    wall = {kind: [max(r["times"][kind][i] for r in records) for i in range(count)] for kind in KINDS}
    cpu = {kind: [sum(r["cpu"][kind][i] for r in records) for i in range(count)] for kind in KINDS}

    def extra(values: dict[str, list[float]], kind: str) -> float:
        return statistics.median(a - b for a, b in zip(values[kind], values["bare"]))

    now, before = extra(wall, "agreement"), extra(wall, "both")
    ratio = statistics.median(a / b for a, b in zip(wall["agreement"], wall["both"]))
    return (f"{nproc:>5}  {statistics.median(wall['bare']) * 1e3:>7.3f}  {statistics.median(wall['both']) * 1e3:>7.3f}"
            f"  {statistics.median(wall['agreement']) * 1e3:>7.3f}  {before * 1e6:>9.0f}  {now * 1e6:>9.0f}"
            f"  {ratio:>6.3f}  {extra(cpu, 'both') * 1e6:>8.0f}  {extra(cpu, 'agreement') * 1e6:>8.0f}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nproc", type=int, nargs="*", default=[2, 4])
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--microbatches", type=int, default=8)
    args = parser.parse_args(argv)
    print(f"per-step failure protocol, 1F1B M={args.microbatches}, tiny MLP, gloo; {load_average()}")
    print("ms/step: bare (neither), both (greeting and agreement: every step before), agreement (every step now);")
    print("extra us over bare (wall, then the ranks' main threads' CPU summed); ratio: agreement / both step time")
    print("nproc     bare     both  agreement  both+us  agree+us   ratio  both+cpu  agree+cpu")
    with tempfile.TemporaryDirectory() as folder:
        for nproc in args.nproc:
            schedule = pipeforge.load("1f1b", defines={"P": nproc, "M": args.microbatches})
            path = str(codegen(schedule, Path(folder) / f"p{nproc}.py"))
            job = {"path": path, "steps": args.steps, "warmup": args.warmup}
            outcomes = spawn(ranks_job, nproc, job, timeout=120, deadline=1200)
            if not all(o.ok for o in outcomes):
                print("\n".join(o.error for o in outcomes if not o.ok), file=sys.stderr)
                return 1
            print(row(nproc, [o.value for o in outcomes]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
