"""Generated 1F1B and interleaved 1F1B modules against torch's own schedules, side by side.

    python -m benchmarks.runtime.mlp                             # gloo on CPU, 2 and 4 processes
    python -m benchmarks.runtime.mlp --backend nccl --nproc 2    # one process per GPU

For each process count, the same float32 MLP stages and the same microbatches
run through (a) the module ``pipeforge codegen`` writes for the library
schedule and (b) torch's ``Schedule1F1B`` / ``ScheduleInterleaved1F1B`` with
real ``PipelineStage`` objects. Steps alternate between the two, each after a
barrier (``benchmarks/runtime/_harness.py``); the reported time of a step is the
slowest rank's, and the table shows medians. The ``tiny`` model (width 4)
measures per-step overhead (Python and message latency); the ``wide`` model
measures a step with real compute.

The per-action overhead: ``us/pair`` is the CPU time of the thread that runs the
schedule, summed over the ranks, per (stage, microbatch) pair (its F, its B, and
their sends and receives), for pipeforge and for torch: on the tiny model that
is the runtime's own work, which the machine's other load disturbs far less
than wall time. One process (``--nproc 1``) shows the compute actions alone,
and there 1F1B (one stage) also runs against the bare loop, in the same rounds
(the ``vs bare loop`` row: its torch columns are the loop's, per microbatch
``x.requires_grad_(); out = m(x); (loss(out, y) / M).backward()``); two and
four processes add the communication, and there each pipeline also runs against
itself with receives posted where the program posts them (``pipe.post_early =
False``; the ``vs late recvs`` row, its torch columns the late-receive runs):
what posting receives ahead of the program gives.
Gradients of the first step are compared between the two; any difference above
1e-4 (relative) is a mismatch and the script exits 1.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import pipeforge
from benchmarks.runtime import _harness
from benchmarks.runtime._harness import TOLERANCE
from pipeforge.generator import codegen

SCHEDULES = {"1f1b": ("1f1b", "Schedule1F1B", 1), "interleaved-1f1b": ("interleaved-1f1b", "ScheduleInterleaved1F1B", 2)}
MODELS = {"tiny": 4, "wide": None}  # None: --width


def build_stages(stages: int, width: int, seed: int):
    import torch

    torch.manual_seed(seed)
    return [torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.Tanh()) for _ in range(stages)]


def bench_worker(rank: int, nproc: int, config: dict) -> dict:
    import copy

    import torch

    from pipeforge.tools.generated import load_module

    device = torch.device("cuda", torch.cuda.current_device()) if config["backend"] == "nccl" else torch.device("cpu")
    records = {}
    for schedule_key, path in config["modules"].items():
        generated = load_module(path)
        info = generated.SCHEDULE
        held = sorted({s for s, _ in info.held(rank)})
        for model_key, width in config["widths"].items():
            full = build_stages(info.stages, width, seed=0)
            theirs = {s: full[s].to(device) for s in held}
            ours = {s: copy.deepcopy(theirs[s]) for s in held}
            # no per-wait timeout (NCCL would then block the CPU on every wait, torch's schedules do not);
            # the process group's timeout still bounds every wait
            pipe = generated.make_pipeline(ours, loss_fn=_harness.mse_loss)
            reference = _harness.torch_schedule(SCHEDULES[schedule_key][1], theirs, info.stages, info.microbatches,
                                                _harness.mse_loss, device=device)
            rows = config["rows"]
            x = torch.randn(rows, width, generator=torch.Generator().manual_seed(1)).to(device)
            y = torch.randn(rows, width, generator=torch.Generator().manual_seed(2)).to(device)
            args = (x,) if pipe.holds_first else ()
            target = y if pipe.holds_last else None
            records[(schedule_key, model_key)] = _harness.measure_pair(
                lambda: pipe.step(*args, target=target), lambda: reference.step(*args, target=target),
                steps=config["steps"], warmup=config["warmup"], modules=(*ours.values(), *theirs.values()),
                device=device, compare=lambda: _harness.max_relative_difference(
                    _harness.gradients(ours), _harness.gradients(theirs)))
            if info.ranks > 1:  # receives posted early (the default) against the program's own posts
                records[(schedule_key, model_key, "late")] = _harness.measure_pair(
                    lambda: _stepped(pipe, True, args, target), lambda: _stepped(pipe, False, args, target),
                    steps=config["steps"], warmup=config["warmup"], modules=ours.values(), device=device)
                pipe.post_early = True
            if len(ours) == 1 and info.ranks == 1:  # one process, one stage: against the bare loop too
                bare = bare_loop(ours[held[0]], x, y, info.microbatches)
                records[(schedule_key, model_key, "bare")] = _harness.measure_pair(
                    lambda: pipe.step(*args, target=target), bare, steps=config["steps"], warmup=config["warmup"],
                    modules=ours.values(), device=device)
    return _harness.gather_on_rank0(rank, nproc, records)


def _stepped(pipe, early: bool, args: tuple, target) -> None:
    pipe.post_early = early
    pipe.step(*args, target=target)


def bare_loop(module, x, y, microbatches: int):
    """What one stage's step is without a runtime: per microbatch ``x.requires_grad_(); out = m(x);
    (loss(out, y) / M).backward()`` (issue 23's reference for the per-action overhead)."""

    def step() -> None:
        for x_mb, y_mb in zip(x.tensor_split(microbatches), y.tensor_split(microbatches)):
            x_mb.requires_grad_()
            (_harness.mse_loss(module(x_mb), y_mb) / microbatches).backward()

    return step


def generate_modules(nproc: int, microbatches: int, out_dir: Path) -> dict[str, str]:
    modules = {}
    for key, (library_name, _, _) in SCHEDULES.items():
        schedule = pipeforge.load(library_name, defines={"P": nproc, "M": microbatches})
        modules[key] = str(codegen(schedule, out_dir / f"{key}-{nproc}"))
    return modules


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nproc", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--backend", choices=("gloo", "nccl"), default="gloo")
    parser.add_argument("--microbatches", type=int, default=8)
    parser.add_argument("--rows", type=int, default=64, help="batch rows (split into microbatches)")
    parser.add_argument("--width", type=int, default=256, help="width of the wide model")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=60.0)
    args = parser.parse_args(argv)
    widths = {key: value or args.width for key, value in MODELS.items()}
    print(_harness.load_average())
    print(f"{'schedule':<18} {'model':<6} {'procs':>5} {'pipeforge ms':>13} {'torch ms':>9} {'ratio':>6} "
          f"{'cpu ratio':>9} {'main ratio':>10} {'us/pair pf':>10} {'us/pair torch':>13} {'grad diff':>9}")
    failed = False
    with tempfile.TemporaryDirectory(prefix="pipeforge-bench-") as out_dir:
        for nproc in args.nproc:
            config = {"modules": generate_modules(nproc, args.microbatches, Path(out_dir)), "widths": widths,
                      "backend": args.backend, "rows": args.rows, "steps": args.steps, "warmup": args.warmup,
                      "timeout": args.timeout}
            outcomes, error = _harness.run_ranks(bench_worker, nproc, config, timeout=args.timeout,
                                                 backend=args.backend, deadline=args.timeout * 4 + 60)
            if error:
                print(error, file=sys.stderr)
                return 1
            for key, row in outcomes[0].value.items():
                schedule_key, model_key = key[:2]
                pairs = nproc * SCHEDULES[schedule_key][2] * args.microbatches  # (stage, microbatch) pairs
                if len(key) == 3:  # against the bare loop, or late receives: the torch columns are theirs
                    title = "  vs bare loop" if key[2] == "bare" else "  vs late recvs"
                    print(f"{title:<18} {model_key:<6} {nproc:>5} {row['pipeforge'] * 1e3:>13.2f} "
                          f"{row['torch'] * 1e3:>9.2f} {row['ratio']:>6.2f} {row['cpu_ratio']:>9.2f} "
                          f"{row['main_ratio']:>10.2f} {row['main_pipeforge'] / pairs * 1e6:>10.1f} "
                          f"{row['main_torch'] / pairs * 1e6:>13.1f} {'':>9}")
                    continue
                print(f"{schedule_key:<18} {model_key:<6} {nproc:>5} {row['pipeforge'] * 1e3:>13.2f} "
                      f"{row['torch'] * 1e3:>9.2f} {row['ratio']:>6.2f} {row['cpu_ratio']:>9.2f} "
                      f"{row['main_ratio']:>10.2f} {row['main_pipeforge'] / pairs * 1e6:>10.1f} "
                      f"{row['main_torch'] / pairs * 1e6:>13.1f} {row['mismatch']:>9.1e}")
                failed |= row["mismatch"] > TOLERANCE
    print(_harness.legend() + "; us/pair: main-thread CPU summed over the ranks per (stage, microbatch) "
          "pair (its F, B, sends and receives); the tiny model's step time is the per-step overhead")
    print(f"after: {_harness.load_average()}")
    if failed:
        print("MISMATCH: pipeforge's gradients differ from torch's", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
