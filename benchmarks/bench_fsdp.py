"""Pipeline x FSDP step time: generated modules against torch's ``_PipelineScheduleRuntime``, side by side.

    .venv/bin/python benchmarks/bench_fsdp.py        # 4 gloo processes: 2 pipeline ranks x 2 shards

For each schedule and ``max_active_stages``, the library schedule goes through
pipeforge's passes (``unshard`` with that ``max_active_stages``, ``reduce_grad``,
``lower``: torch's ``_add_unshard_reshard``, ``_add_reduce_grad``,
``_add_send_recv``) into one compute_comms CSV. pipeforge reads it and
generates a module; torch's
``_PipelineScheduleRuntime`` loads the same file (``_load_csv(...,
format="compute_comms")``) with real ``PipelineStage`` objects. Both get the
same float32 MLP stages, each wrapped with FSDP2's ``fully_shard`` over the
data-parallel group (``reshard_after_forward=False``). Steps alternate between
the two, each after a barrier; a step's time is the slowest rank's; the table
shows medians and the median of the per-step ratios. The full gradients after
the first step are compared; a relative difference above 1e-4 exits 1.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import pipeforge  # noqa: E402
from pipeforge.generator import codegen  # noqa: E402
from pipeforge.interop.torch_csv import read_csv_text, to_csv_text  # noqa: E402
from pipeforge.runtime.launch import spawn  # noqa: E402

SCHEDULES = ("1f1b", "interleaved-1f1b", "zbv")
PIPELINE_RANKS, REPLICAS = 2, 2


def lowered_csv(name: str, microbatches: int, max_active_stages: int) -> str:
    """The library schedule through pipeforge's unshard, reduce_grad and lower passes, as torch CSV text
    (what ``pipeforge lower --unshard K --reduce-grad`` prints)."""
    from pipeforge.passes import PassOptions, apply_passes

    schedule = pipeforge.load(name, defines={"P": PIPELINE_RANKS, "M": microbatches})
    lowered = apply_passes(schedule, PassOptions(unshard=max_active_stages, reduce_grad=True), lower=True)
    return to_csv_text(lowered, "compute_comms")


def build_stages(stages: int, width: int, seed: int):
    import torch

    torch.manual_seed(seed)
    return [torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.Tanh(), torch.nn.Linear(width, width))
            for _ in range(stages)]


def loss_fn(output, target):
    import torch

    return torch.nn.functional.mse_loss(output, target)


def sharded(module, mesh):
    from torch.distributed.fsdp import fully_shard

    return fully_shard(module, mesh=mesh, reshard_after_forward=False)


def timed_step(step) -> tuple[float, float]:
    """Wall time and this process's CPU time (all its threads) of one step."""
    import torch.distributed as dist

    dist.barrier()
    started, cpu_started = time.perf_counter(), time.process_time()
    step()
    return time.perf_counter() - started, time.process_time() - cpu_started


def full_grads(modules: dict) -> list:
    return [p.grad.full_tensor().detach().clone() for _, m in sorted(modules.items()) for p in m.parameters()]


def max_relative_difference(ours: list, theirs: list) -> float:
    worst = 0.0
    for a, b in zip(ours, theirs):
        worst = max(worst, (a - b).abs().max().item() / max(b.abs().max().item(), 1e-12))
    return worst


def bench_job(rank: int, job: dict, config: dict, pp_group, dp_group, mesh) -> dict:
    import torch
    from torch.distributed.pipelining import PipelineStage
    from torch.distributed.pipelining.schedules import _PipelineScheduleRuntime

    from pipeforge.runtime.check import load_module

    generated = load_module(job["module_path"])
    info = generated.SCHEDULE
    prank = rank % PIPELINE_RANKS
    held = sorted({s for s, _ in info.held(prank)})
    full = build_stages(info.stages, config["width"], seed=0)
    ours = {s: sharded(copy.deepcopy(full[s]), mesh) for s in held}
    theirs = {s: sharded(copy.deepcopy(full[s]), mesh) for s in held}
    pipe = generated.make_pipeline(ours, loss_fn=loss_fn, group=pp_group, dp_group=dp_group)
    device = torch.device("cpu")
    stages = [PipelineStage(m, s, info.stages, device, group=pp_group) for s, m in sorted(theirs.items())]
    reference = _PipelineScheduleRuntime(stages, info.microbatches, loss_fn=loss_fn)
    reference._load_csv(job["csv_path"], format="compute_comms")
    generator = torch.Generator().manual_seed(1 + rank // PIPELINE_RANKS)
    x = torch.randn(config["rows"], config["width"], generator=generator)
    y = torch.randn(config["rows"], config["width"], generator=generator)
    args, target = ((x,) if pipe.holds_first else ()), (y if pipe.holds_last else None)
    times: dict[str, list[float]] = {"pipeforge": [], "torch": []}
    cpu: dict[str, list[float]] = {"pipeforge": [], "torch": []}
    mismatch = 0.0
    for step in range(config["warmup"] + config["steps"]):
        ours_time, ours_cpu = timed_step(lambda: pipe.step(*args, target=target))
        theirs_time, theirs_cpu = timed_step(lambda: reference.step(*args, target=target))
        if step == 0:
            mismatch = max_relative_difference(full_grads(ours), full_grads(theirs))
        for module in (*ours.values(), *theirs.values()):
            module.zero_grad(set_to_none=True)
        if step >= config["warmup"]:
            times["pipeforge"].append(ours_time)
            times["torch"].append(theirs_time)
            cpu["pipeforge"].append(ours_cpu)
            cpu["torch"].append(theirs_cpu)
    return {"times": times, "cpu": cpu, "mismatch": mismatch}


def bench_worker(rank: int, nproc: int, config: dict) -> dict:
    import torch.distributed as dist
    from torch.distributed.device_mesh import DeviceMesh

    pipelines = [dist.new_group([0, 1]), dist.new_group([2, 3])]
    replicas = [dist.new_group([0, 2]), dist.new_group([1, 3])]
    pp_group, dp_group = pipelines[rank // PIPELINE_RANKS], replicas[rank % PIPELINE_RANKS]
    mesh = DeviceMesh.from_group(dp_group, device_type="cpu")
    results = {key: bench_job(rank, job, config, pp_group, dp_group, mesh) for key, job in config["jobs"].items()}
    gathered = [None] * nproc
    dist.all_gather_object(gathered, results)
    return summarize(gathered) if rank == 0 else {}


def summarize(per_rank: list[dict]) -> dict:
    summary = {}
    for key in per_rank[0]:
        slowest = {side: [max(step) for step in zip(*(r[key]["times"][side] for r in per_rank))]
                   for side in ("pipeforge", "torch")}
        summary[key] = {
            "pipeforge": statistics.median(slowest["pipeforge"]),
            "torch": statistics.median(slowest["torch"]),
            "ratio": statistics.median(a / b for a, b in zip(slowest["pipeforge"], slowest["torch"])),
            "cpu_ratio": cpu_ratio(per_rank, key),
            "mismatch": max(r[key]["mismatch"] for r in per_rank),
        }
    return summary


def cpu_ratio(per_rank: list[dict], key) -> float:
    """CPU time of a step summed over the ranks, pipeforge / torch (median over steps): the work each
    runtime spends, which the machine's other load disturbs far less than wall time."""
    totals = {side: [sum(step) for step in zip(*(r[key]["cpu"][side] for r in per_rank))]
              for side in ("pipeforge", "torch")}
    return statistics.median(a / b for a, b in zip(totals["pipeforge"], totals["torch"]) if b > 0)


def make_jobs(args, out_dir: Path) -> dict:
    jobs = {}
    for name in args.schedules:
        for active in args.max_active_stages:
            text = lowered_csv(name, args.microbatches, active)
            csv_path = out_dir / f"{name}-{active}.csv"
            csv_path.write_text(text)
            module = codegen(read_csv_text(text, str(csv_path)), out_dir / f"{name}-{active}")
            jobs[(name, active)] = {"module_path": str(module), "csv_path": str(csv_path)}
    return jobs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--schedules", nargs="+", default=list(SCHEDULES))
    parser.add_argument("--max-active-stages", type=int, nargs="+", default=[1, 3])
    parser.add_argument("--microbatches", type=int, default=8)
    parser.add_argument("--rows", type=int, default=64, help="batch rows of each replica")
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=120.0)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="pipeforge-bench-fsdp-") as out_dir:
        config = {"jobs": make_jobs(args, Path(out_dir)), "rows": args.rows, "width": args.width,
                  "steps": args.steps, "warmup": args.warmup}
        outcomes = spawn(bench_worker, PIPELINE_RANKS * REPLICAS, config, timeout=args.timeout,
                         deadline=args.timeout * 10 + 120)
    if not all(o.ok for o in outcomes):
        print("\n".join(f"rank {o.rank}: {o.error}" for o in outcomes if not o.ok), file=sys.stderr)
        return 1
    print(f"{'schedule':<18} {'max_active':>10} {'pipeforge ms':>13} {'torch ms':>9} {'ratio':>6} {'cpu ratio':>9} "
          f"{'grad diff':>9}")
    failed = False
    for (name, active), row in outcomes[0].value.items():
        print(f"{name:<18} {active:>10} {row['pipeforge'] * 1e3:>13.2f} {row['torch'] * 1e3:>9.2f} "
              f"{row['ratio']:>6.2f} {row['cpu_ratio']:>9.2f} {row['mismatch']:>9.1e}")
        failed |= row["mismatch"] > 1e-4
    print(f"4 gloo processes ({PIPELINE_RANKS} pipeline ranks x {REPLICAS} FSDP shards), {args.microbatches} "
          f"microbatches, width {args.width}, {args.steps} steps; times: median of the slowest rank; ratio: median "
          "over steps of pipeforge / torch (target <= 1.0); cpu ratio: the same for CPU time summed over ranks")
    if failed:
        print("MISMATCH: pipeforge's gradients differ from torch's", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
