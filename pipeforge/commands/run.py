"""``pipeforge run``: train a small model with the generated pipeline and check it against no pipeline."""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import tempfile
import time

from pipeforge.commands.common import add_input_arguments, print_json
from pipeforge.commands.exits import Exit
from pipeforge.commands.lower import add_pass_arguments, load_with_passes, pass_flags, pass_options, semantics_for
from pipeforge.errors import UsageError

MAX_LOCAL_PROCESSES = 64  # each is a torch process; more would exhaust one machine's memory


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "run", help="run the schedule on local processes and compare with the unpipelined model",
        description="Generate the schedule's module, run STEPS SGD steps of a small float64 model on NPROC "
                    "local processes (gloo on 127.0.0.1, or NCCL), and compare losses, outputs, every "
                    "gradient and the parameters with the same model trained without pipelining.")
    add_input_arguments(parser)
    add_pass_arguments(parser)
    parser.add_argument("--nproc", type=int, help="number of processes (default: the schedule's ranks)")
    parser.add_argument("--steps", type=int, default=2, help="training steps (default 2)")
    parser.add_argument("--model", choices=("mlp", "tuple"), default="mlp",
                        help="mlp: stages change the width; tuple: activations are pairs of tensors")
    parser.add_argument("--backend", choices=("auto", "gloo", "nccl"), default="auto",
                        help="auto (default): NCCL when every rank can have its own GPU, else gloo")
    parser.add_argument("--device", choices=("cpu", "cuda"),
                        help="where the model runs (default: CUDA under NCCL, else CPU); gloo with cuda stages "
                             "activations through host memory, so several ranks may share one GPU")
    parser.add_argument("--timeout", type=float, metavar="S",
                        help="seconds any rank may wait for a peer before failing (default 30, times the machine's "
                             "load per core or PIPEFORGE_TIME_SCALE)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--print-torchrun", action="store_true",
                        help="print the torchrun line that runs this check on several machines, and exit")
    parser.add_argument("--nnodes", type=int, metavar="N",
                        help="with --print-torchrun: the line for N machines joined by torchrun's c10d "
                             "rendezvous (the same line on every machine; tested as two agents on 127.0.0.1)")
    parser.add_argument("--from-env", action="store_true", help=argparse.SUPPRESS)  # set by --print-torchrun
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from pipeforge.generator import codegen

    schedule = load_with_passes(args)
    nproc = args.nproc if args.nproc is not None else schedule.ranks
    if nproc < 1:  # (the advice below, -D P=0, would be no better)
        raise UsageError(f"--nproc {nproc}: expected at least 1 process (schedule {schedule.name!r} has "
                         f"{schedule.ranks} ranks: --nproc {schedule.ranks})")
    if nproc != schedule.ranks:
        raise UsageError(f"schedule {schedule.name!r} has {schedule.ranks} ranks but --nproc is {nproc}; "
                         f"pass -D P={nproc} or --nproc {schedule.ranks}")
    if args.device == "cpu" and args.backend == "nccl":
        raise UsageError("--backend nccl needs --device cuda (NCCL moves GPU memory only)")
    if args.steps < 1:
        raise UsageError("--steps must be at least 1")
    if args.timeout is not None and not 0 < args.timeout < float("inf"):
        raise UsageError(f"--timeout {args.timeout:g}: expected a positive number of seconds")
    if args.nnodes is not None and not (args.print_torchrun and 1 <= args.nnodes <= nproc and nproc % args.nnodes == 0):
        raise UsageError(f"--nnodes {args.nnodes}: goes with --print-torchrun and must divide the {nproc} ranks "
                         "(each machine runs the same number)")
    if args.print_torchrun:
        print(torchrun_line(args, nproc) if args.nnodes is None else rendezvous_line(args, nproc))
        return Exit.OK
    if nproc > MAX_LOCAL_PROCESSES and not args.from_env:
        raise UsageError(f"--nproc {nproc}: at most {MAX_LOCAL_PROCESSES} local processes; for more, "
                         f"--print-torchrun gives the line that runs the check across machines")
    require_torch()
    require_cuda(args)
    from pipeforge.tools.launch import resolve_backend

    local_ranks = int(os.environ.get("LOCAL_WORLD_SIZE", nproc)) if args.from_env else nproc
    args.backend = resolve_backend(args.backend, local_ranks)
    with tempfile.TemporaryDirectory(prefix="pipeforge-run-") as out_dir:
        module = str(codegen(schedule, out_dir, semantics=semantics_for(pass_options(args))))
        started = time.monotonic()
        verdict = _check(args, module, nproc)
        seconds = time.monotonic() - started
    if verdict is None:  # a torchrun rank other than 0
        return Exit.OK
    return _report(args, schedule.name, nproc, verdict, seconds)


def require_torch() -> None:
    """Refuse early, and plainly, where torch is not installed (it is an extra)."""
    import importlib.util

    if importlib.util.find_spec("torch") is None:
        raise UsageError("'pipeforge run' needs torch: pip install torch==2.13.0 (or any torch 2.6-2.14), "
                         "or install pipeforge with its [torch] extra")


def require_cuda(args: argparse.Namespace) -> None:
    """--device cuda or --backend nccl on a machine with no CUDA device: say so, not a rank's crash."""
    import torch

    if (args.device == "cuda" or args.backend == "nccl") and not torch.cuda.is_available():
        flag = "--device cuda" if args.device == "cuda" else "--backend nccl"
        raise UsageError(f"{flag}: torch finds no CUDA device here; leave it out to run on the CPU with gloo")


def _check(args: argparse.Namespace, module: str, nproc: int) -> dict | None:
    if args.from_env:
        from pipeforge.tools.reference_check import run_check_from_environment

        from pipeforge.tools.launch import RUN_TIMEOUT, time_scale

        timeout = RUN_TIMEOUT * time_scale() if args.timeout is None else args.timeout
        return run_check_from_environment(module, steps=args.steps, model=args.model, backend=args.backend,
                                          timeout=timeout, device=args.device)
    from pipeforge.tools.launch import run_check

    return run_check(module, nproc, steps=args.steps, model=args.model, backend=args.backend, timeout=args.timeout,
                     device=args.device)


def _report(args: argparse.Namespace, name: str, nproc: int, verdict: dict, seconds: float) -> int:
    result = {"match": verdict["match"], "max_abs_diff": verdict["max_abs_diff"], "steps": args.steps,
              "nproc": nproc, "backend": args.backend}
    if args.json:
        print_json(result)
    else:
        status = "match" if verdict["match"] else "MISMATCH"
        diff = verdict["max_abs_diff"]
        shown = "not compared (a rank failed)" if diff is None else f"{diff:.3g}"
        print(f"{name}: {status} on {nproc} processes ({args.backend}), {args.steps} steps of the {args.model} "
              f"model in {seconds:.1f} s: max |pipelined - unpipelined| = {shown}", flush=True)
    if not verdict["match"]:
        for rank, error in sorted(verdict.get("errors", {}).items()):
            print(f"rank {rank}: {error.strip().splitlines()[-1]}", file=sys.stderr)
        if verdict.get("worst"):
            print(f"largest difference: {verdict['worst']}", file=sys.stderr)
        for missing in verdict.get("missing", []):
            print(f"missing: {missing}", file=sys.stderr)
    return Exit.OK if verdict["match"] else Exit.INVALID


def rendezvous_line(args: argparse.Namespace, nproc: int) -> str:
    """torchrun for ``--nnodes`` machines joined by c10d rendezvous: one line, the same on every machine."""
    launcher = (f"torchrun --nnodes={args.nnodes} --nproc-per-node={nproc // args.nnodes} --rdzv-backend=c10d "
                "--rdzv-endpoint=$RDZV_HOST:29500 --rdzv-id=$JOB_ID")
    command = check_command(args)
    return (f"# on each of the {args.nnodes} machines (RDZV_HOST: one of them, reachable from all; JOB_ID: any "
            f"name, the same on all):\n{launcher} {shlex.join(command)}")


def check_command(args: argparse.Namespace) -> list[str]:
    command = ["-m", "pipeforge", "run", args.path, *(f"-D{d}" for d in args.defines)]
    if args.schedule:
        command += ["--schedule", args.schedule]
    command += pass_flags(args)
    command += ["--steps", str(args.steps), "--model", args.model, "--backend", args.backend]
    if args.timeout is not None:  # else each machine scales the default by its own load
        command += ["--timeout", f"{args.timeout:g}"]
    command += ["--from-env"]
    if args.device:
        command[-1:-1] = ["--device", args.device]
    return command


def torchrun_line(args: argparse.Namespace, nproc: int) -> str:
    """torchrun for NODES machines; the same line runs on each with its own NODE_RANK."""
    launcher = ("torchrun --nnodes=$NODES --nproc-per-node=$NPROC_PER_NODE --node-rank=$NODE_RANK "
                "--master-addr=$MASTER_ADDR --master-port=29500")
    command = check_command(args)
    return f"# on each of NODES machines, with NODES * NPROC_PER_NODE = {nproc}:\n{launcher} {shlex.join(command)}"
