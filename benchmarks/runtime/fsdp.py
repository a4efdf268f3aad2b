"""Pipeline x FSDP step time: generated modules against torch's ``_PipelineScheduleRuntime``, side by side.

    python -m benchmarks.runtime.fsdp        # 4 gloo processes: 2 pipeline ranks x 2 shards

For each schedule and ``max_active_stages``, the library schedule goes through
pipeforge's passes (``unshard`` with that ``max_active_stages``, ``reduce_grad``,
``lower``: torch's ``_add_unshard_reshard``, ``_add_reduce_grad``,
``_add_send_recv``) into one compute_comms CSV. pipeforge reads it and
generates a module; torch's
``_PipelineScheduleRuntime`` loads the same file (``_load_csv(...,
format="compute_comms")``) with real ``PipelineStage`` objects. Both get the
same float32 MLP stages, each wrapped with FSDP2's ``fully_shard`` over the
data-parallel group (``reshard_after_forward=False``). Steps alternate between
the two, each after a barrier (``benchmarks/runtime/_harness.py``); a step's time is the
slowest rank's; the table shows medians and the median of the per-step ratios. The full gradients after
the first step are compared; a relative difference above 1e-4 exits 1.
"""

from __future__ import annotations

import argparse
import copy
import sys
import tempfile
from pathlib import Path

import pipeforge
from benchmarks.runtime import _harness
from benchmarks.runtime._harness import TOLERANCE
from pipeforge.generator import codegen
from pipeforge.interop.torch_csv import read_csv_text, to_csv_text

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


def sharded(module, mesh):
    from torch.distributed.fsdp import fully_shard

    return fully_shard(module, mesh=mesh, reshard_after_forward=False)


def bench_job(rank: int, job: dict, config: dict, pp_group, dp_group, mesh) -> dict:
    import torch
    from torch.distributed.pipelining import PipelineStage
    from torch.distributed.pipelining.schedules import _PipelineScheduleRuntime

    from pipeforge.tools.generated import load_module

    generated = load_module(job["module_path"])
    info = generated.SCHEDULE
    prank = rank % PIPELINE_RANKS
    held = sorted({s for s, _ in info.held(prank)})
    full = build_stages(info.stages, config["width"], seed=0)
    ours = {s: sharded(copy.deepcopy(full[s]), mesh) for s in held}
    theirs = {s: sharded(copy.deepcopy(full[s]), mesh) for s in held}
    pipe = generated.make_pipeline(ours, loss_fn=_harness.mse_loss, group=pp_group, dp_group=dp_group)
    device = torch.device("cpu")
    stages = [PipelineStage(m, s, info.stages, device, group=pp_group) for s, m in sorted(theirs.items())]
    reference = _PipelineScheduleRuntime(stages, info.microbatches, loss_fn=_harness.mse_loss)
    reference._load_csv(job["csv_path"], format="compute_comms")
    generator = torch.Generator().manual_seed(1 + rank // PIPELINE_RANKS)
    x = torch.randn(config["rows"], config["width"], generator=generator)
    y = torch.randn(config["rows"], config["width"], generator=generator)
    args, target = ((x,) if pipe.holds_first else ()), (y if pipe.holds_last else None)
    return _harness.measure_pair(
        lambda: pipe.step(*args, target=target), lambda: reference.step(*args, target=target),
        steps=config["steps"], warmup=config["warmup"], modules=(*ours.values(), *theirs.values()),
        compare=lambda: _harness.max_relative_difference(_harness.gradients(ours, full=True),
                                                         _harness.gradients(theirs, full=True)))


def bench_worker(rank: int, nproc: int, config: dict) -> dict:
    import torch.distributed as dist
    from torch.distributed.device_mesh import DeviceMesh

    pipelines = [dist.new_group([0, 1]), dist.new_group([2, 3])]
    replicas = [dist.new_group([0, 2]), dist.new_group([1, 3])]
    pp_group, dp_group = pipelines[rank // PIPELINE_RANKS], replicas[rank % PIPELINE_RANKS]
    mesh = DeviceMesh.from_group(dp_group, device_type="cpu")
    results = {key: bench_job(rank, job, config, pp_group, dp_group, mesh) for key, job in config["jobs"].items()}
    return _harness.gather_on_rank0(rank, nproc, results)


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
    before = _harness.load_average()
    with tempfile.TemporaryDirectory(prefix="pipeforge-bench-fsdp-") as out_dir:
        config = {"jobs": make_jobs(args, Path(out_dir)), "rows": args.rows, "width": args.width,
                  "steps": args.steps, "warmup": args.warmup}
        outcomes, error = _harness.run_ranks(bench_worker, PIPELINE_RANKS * REPLICAS, config,
                                             timeout=args.timeout, deadline=args.timeout * 10 + 120)
    if error:
        print(error, file=sys.stderr)
        return 1
    print(f"{'schedule':<18} {'max_active':>10} {'pipeforge ms':>13} {'torch ms':>9} {'ratio':>6} "
          f"{'pipeforge cpu ms':>16} {'torch cpu ms':>12} {'cpu ratio':>9} {'main ratio':>10} {'grad diff':>9}")
    failed = False
    for (name, active), row in outcomes[0].value.items():
        print(f"{name:<18} {active:>10} {row['pipeforge'] * 1e3:>13.2f} {row['torch'] * 1e3:>9.2f} "
              f"{row['ratio']:>6.2f} {row['cpu_pipeforge'] * 1e3:>16.2f} {row['cpu_torch'] * 1e3:>12.2f} "
              f"{row['cpu_ratio']:>9.2f} {row['main_ratio']:>10.2f} {row['mismatch']:>9.1e}")
        failed |= row["mismatch"] > TOLERANCE
    print(f"4 gloo processes ({PIPELINE_RANKS} pipeline ranks x {REPLICAS} FSDP shards), {args.microbatches} "
          f"microbatches, width {args.width}, {args.steps} steps; times: median of the slowest rank; ratio: median "
          "over steps of pipeforge / torch (target <= 1.0); cpu ms: median CPU time of a step summed over the ranks "
          "(all threads); cpu ratio: the median of its per-step ratios; main ratio: the same for the CPU time of "
          f"the thread that runs the schedule; before: {before}; after: {_harness.load_average()}")
    if failed:
        print("MISMATCH: pipeforge's gradients differ from torch's", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
