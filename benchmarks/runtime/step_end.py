"""What the step-end agreement costs: the same pipeline's steps with it and without it, side by side.

    python -m benchmarks.runtime.step_end                 # 1F1B, 2 and 4 gloo processes, M = 8
    python -m benchmarks.runtime.step_end --steps 200

Every ``step()`` ends with an agreement (one word per rank, on a gloo group of its own) on whether it
failed on any rank (``pipeforge.runtime.recovery.StepStart.end``), so no rank
returns normally from a step that failed elsewhere. On every rank one pipeline of
the tiny demo MLP (width 4: per-step overhead, not compute) runs steps that
alternate between ``pipe.end_agreement = True`` and ``False``, each after a
barrier, which of a pair runs first alternating too. A step's time is the
slowest rank's; the row shows the medians and the median per-pair difference,
and the median per-pair difference of the main threads' CPU time summed over the ranks.
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


def ranks_job(rank: int, nproc: int, job: dict) -> dict:
    import torch.distributed as dist

    from pipeforge.tools import demo_models as models
    from pipeforge.tools.generated import load_module

    generated = load_module(job["path"])
    info = generated.SCHEDULE
    full = models.build_stages("mlp", info.stages, seed=0)
    pipe = generated.make_pipeline({s: full[s] for s in info.stages_of(rank)}, loss_fn=models.loss_fn, timeout=60)
    x, y = models.make_batch(info.stages, 2 * info.microbatches, seed=0)
    times: dict[bool, list[float]] = {True: [], False: []}
    cpu: dict[bool, list[float]] = {True: [], False: []}
    for index in range(job["warmup"] + job["steps"]):
        for agree in ((True, False) if index % 2 else (False, True)):
            pipe.end_agreement = agree
            dist.barrier()
            started, cpu_started = time.perf_counter(), time.thread_time()
            pipe.step(*((x,) if pipe.holds_first else ()), target=y if pipe.holds_last else None)
            if index >= job["warmup"]:
                times[agree].append(time.perf_counter() - started)
                cpu[agree].append(time.thread_time() - cpu_started)
    return {"on": times[True], "off": times[False], "cpu on": cpu[True], "cpu off": cpu[False]}


def row(nproc: int, records: list[dict]) -> str:
    on = [max(r["on"][i] for r in records) for i in range(len(records[0]["on"]))]
    off = [max(r["off"][i] for r in records) for i in range(len(records[0]["off"]))]
    extra = statistics.median(a - b for a, b in zip(on, off))
    cpu = [sum(r["cpu on"][i] - r["cpu off"][i] for r in records) for i in range(len(records[0]["on"]))]
    return (f"{nproc:>5}  {statistics.median(on) * 1e3:>9.3f}  {statistics.median(off) * 1e3:>9.3f}  "
            f"{extra * 1e6:>10.0f}  {extra / statistics.median(off):>7.1%}  {statistics.median(cpu) * 1e6:>10.0f}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nproc", type=int, nargs="*", default=[2, 4])
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--microbatches", type=int, default=8)
    args = parser.parse_args(argv)
    print(f"step-end agreement, 1F1B M={args.microbatches}, tiny MLP, gloo; load {load_average()}")
    print("nproc  on ms/step  off ms/step  extra us  extra %  extra cpu us (the ranks' main threads, summed)")
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
