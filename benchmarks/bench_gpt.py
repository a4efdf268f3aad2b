"""A small GPT on 4 gloo processes: pipeforge's generated modules against torch's schedules, side by side.

    .venv/bin/python benchmarks/bench_gpt.py                       # the six schedules, P=4, M=8, 20 steps
    .venv/bin/python benchmarks/bench_gpt.py --schedules gpipe 1f1b --steps 40

The model is ``examples/train_gpt.py``'s GPT (``nn.Embedding``, ``--layers``
``nn.TransformerEncoderLayer`` blocks, an LM head; float32 on CPU), split into
the schedule's stages. For each schedule, one run of ``--nproc`` processes
builds the same stage modules twice and runs (a) the module ``pipeforge
codegen`` writes for the library schedule and (b) torch's own schedule class
with real ``PipelineStage`` objects. Steps alternate between the two, each after
a barrier, so a pair of steps shares the machine's load (which of the pair runs
first alternates too); the time of a step is the slowest rank's. Reported: the medians, and the median of the per-step ratios
pipeforge / torch (the target is at most 1.0). The first step's gradients are
compared; a relative difference above 1e-4 is a mismatch (exit 1). A schedule
whose run fails is reported with its first error and the others still run.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "examples"))

import pipeforge  # noqa: E402
from pipeforge.generator import codegen  # noqa: E402
from pipeforge.runtime.launch import spawn  # noqa: E402

# library schedule -> torch.distributed.pipelining class
SCHEDULES = {
    "1f1b": "Schedule1F1B",
    "gpipe": "ScheduleGPipe",
    "interleaved-1f1b": "ScheduleInterleaved1F1B",
    "interleaved-zb": "ScheduleInterleavedZeroBubble",
    "zbv": "ScheduleZBVZeroBubble",
    "dualpipev": "ScheduleDualPipeV",
}
V_SCHEDULES = ("ScheduleZBVZeroBubble", "ScheduleDualPipeV")
TOLERANCE = 1e-4


def torch_schedule(class_name: str, modules: dict, stages: int, microbatches: int, loss_fn):
    import torch
    from torch.distributed.pipelining import PipelineStage, schedules

    device = torch.device("cpu")
    pipeline_stages = [PipelineStage(m, s, stages, device) for s, m in sorted(modules.items())]
    cls = getattr(schedules, class_name)
    if issubclass(cls, schedules.PipelineScheduleSingle):
        return cls(pipeline_stages[0], microbatches, loss_fn=loss_fn)
    return cls(pipeline_stages, microbatches, loss_fn=loss_fn)


def check_placement(info, class_name: str, ranks: int) -> None:
    """pipeforge's placement must be the one torch's class assumes, or the comparison means nothing."""
    from torch.distributed.pipelining._utils import generate_stage_to_rank_mapping

    style = "v" if class_name in V_SCHEDULES else "loop"
    theirs = generate_stage_to_rank_mapping(ranks, info.stages, style=style)
    if tuple(theirs[s] for s in range(info.stages)) != info.placements[0]:
        raise RuntimeError(f"{info.name}: placement {info.placements[0]} differs from torch's {theirs}")


def timed(step) -> tuple[float, float]:
    """Wall time and this process's CPU time of one step, started together after a barrier."""
    import torch.distributed as dist

    dist.barrier()
    started, cpu_started = time.perf_counter(), time.process_time()
    step()
    return time.perf_counter() - started, time.process_time() - cpu_started


def grads(modules: dict) -> list:
    return [p.grad.detach().clone() for _, m in sorted(modules.items()) for p in m.parameters() if p.grad is not None]


def relative_difference(ours: list, theirs: list) -> float:
    if len(ours) != len(theirs):
        return float("inf")
    worst = 0.0
    for a, b in zip(ours, theirs):
        worst = max(worst, (a - b).abs().max().item() / max(b.abs().max().item(), 1e-12))
    return worst


def bench_worker(rank: int, nproc: int, config: dict) -> dict:
    import copy

    import torch

    from pipeforge.runtime.check import load_module
    from train_gpt import GPTConfig, gpt_stages, lm_loss, token_batches

    generated = load_module(config["module"])
    info = generated.SCHEDULE
    check_placement(info, config["torch_class"], nproc)
    model = GPTConfig(**config["model"])
    pieces = gpt_stages(model, info.stages, seed=0)
    theirs = {s: pieces[s] for s in generated.stages_of_rank(rank)}
    ours = {s: copy.deepcopy(m) for s, m in theirs.items()}
    pipe = generated.make_pipeline(ours, loss_fn=lm_loss, timeout=config["timeout"])
    reference = torch_schedule(config["torch_class"], theirs, info.stages, info.microbatches, lm_loss)
    tokens, target = next(token_batches(model, config["rows"]))
    args = (tokens,) if pipe.holds_first else ()
    label = target if pipe.holds_last else None
    times: dict[str, list[float]] = {"pipeforge": [], "torch": []}
    cpu: dict[str, list[float]] = {"pipeforge": [], "torch": []}
    mismatch = 0.0
    for step in range(config["warmup"] + config["steps"]):
        if step % 2 == 0:  # which runs first alternates, so neither gains from the other's leftovers
            ours_time, ours_cpu = timed(lambda: pipe.step(*args, target=label))
            theirs_time, theirs_cpu = timed(lambda: reference.step(*args, target=label))
        else:
            theirs_time, theirs_cpu = timed(lambda: reference.step(*args, target=label))
            ours_time, ours_cpu = timed(lambda: pipe.step(*args, target=label))
        if step == 0:
            mismatch = relative_difference(grads(ours), grads(theirs))
        for module in (*ours.values(), *theirs.values()):
            module.zero_grad(set_to_none=True)
        if step >= config["warmup"]:
            times["pipeforge"].append(ours_time)
            times["torch"].append(theirs_time)
            cpu["pipeforge"].append(ours_cpu)
            cpu["torch"].append(theirs_cpu)
    return {"times": times, "cpu": cpu, "mismatch": mismatch}


def summarize(values: list[dict]) -> dict:
    """The slowest rank's time of each step; medians; the median of per-step ratios; and the same
    ratio for CPU time summed over the ranks (the work each runtime does, which the machine's other
    load disturbs far less than wall time)."""
    sides = ("pipeforge", "torch")
    slowest = {side: [max(step) for step in zip(*(v["times"][side] for v in values))] for side in sides}
    work = {side: [sum(step) for step in zip(*(v["cpu"][side] for v in values))] for side in sides}
    return {
        "pipeforge": statistics.median(slowest["pipeforge"]),
        "torch": statistics.median(slowest["torch"]),
        "ratio": statistics.median(a / b for a, b in zip(slowest["pipeforge"], slowest["torch"])),
        "cpu_ratio": statistics.median(a / b for a, b in zip(work["pipeforge"], work["torch"]) if b > 0),
        "mismatch": max(v["mismatch"] for v in values),
    }


def first_error(outcomes) -> str:
    failed = [o for o in outcomes if not o.ok]
    # the rank that raised first says why; its peers only report the lost connection
    failed.sort(key=lambda o: ("Connection closed" in o.error or "failed (waits" in o.error, o.rank))
    lines = [line for line in failed[0].error.strip().splitlines() if line.strip()]
    return f"rank {failed[0].rank}: {lines[-1].strip()}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--schedules", nargs="+", choices=sorted(SCHEDULES), default=list(SCHEDULES))
    parser.add_argument("--nproc", type=int, default=4)
    parser.add_argument("--microbatches", type=int, default=8)
    parser.add_argument("--rows", type=int, default=16, help="sequences per batch (split into microbatches)")
    parser.add_argument("--seq", type=int, default=32)
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--vocab", type=int, default=128)
    parser.add_argument("--steps", type=int, default=20, help="measured steps (after --warmup)")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=120.0)
    args = parser.parse_args(argv)
    model = {"vocab": args.vocab, "seq": args.seq, "width": args.width, "heads": args.heads, "layers": args.layers}
    print(f"GPT {model}, rows {args.rows}, P={args.nproc}, M={args.microbatches}, float32, gloo on CPU, "
          f"median of {args.steps} steps")
    print(f"{'schedule':<17} {'torch class':<30} {'pipeforge ms':>12} {'torch ms':>9} {'ratio':>6} {'cpu ratio':>9} {'grad diff':>9}")
    failed = False
    with tempfile.TemporaryDirectory(prefix="pipeforge-bench-gpt-") as out_dir:
        for name in args.schedules:
            schedule = pipeforge.load(name, defines={"P": args.nproc, "M": args.microbatches})
            module = str(codegen(schedule, out_dir))  # one module per schedule name
            config = {"module": module, "torch_class": SCHEDULES[name], "model": model, "rows": args.rows,
                      "steps": args.steps, "warmup": args.warmup, "timeout": args.timeout}
            outcomes = spawn(bench_worker, args.nproc, config, timeout=args.timeout, deadline=args.timeout * 6)
            if not all(o.ok for o in outcomes):
                print(f"{name:<17} {SCHEDULES[name]:<30} failed: {first_error(outcomes)}", flush=True)
                failed = True
                continue
            row = summarize([o.value for o in outcomes])
            print(f"{name:<17} {SCHEDULES[name]:<30} {row['pipeforge'] * 1e3:>12.1f} {row['torch'] * 1e3:>9.1f} "
                  f"{row['ratio']:>6.2f} {row['cpu_ratio']:>9.2f} {row['mismatch']:>9.1e}", flush=True)
            failed |= row["mismatch"] > TOLERANCE
    print("ms: median over steps of the slowest rank; ratio: median over steps of pipeforge / torch "
          "(<= 1.0 is the target); cpu ratio: the same for CPU time summed over the ranks")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
