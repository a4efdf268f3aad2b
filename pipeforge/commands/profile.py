"""``pipeforge profile``: measure a model's per-stage costs and write a cost file (``--costs FILE``)."""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

from pipeforge.commands.common import add_force_argument, print_json, require_suffix
from pipeforge.commands.exits import Exit
from pipeforge.errors import UsageError, printable
from pipeforge.files import check_replaceable, write_output


PROFILE_TIMEOUT = 120.0  # seconds a rank waits for a peer on an idle machine (times time_scale())


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "profile", help="measure a model's per-stage costs on local processes and write a cost file",
        description="Run the stage modules of MODEL.py (a function pipeforge_model(stages) returning "
                    "{'modules', 'batch', 'target', 'loss_fn'}: docs/profile.md) with the pipeforge runtime on "
                    "STAGES local gloo processes (ZB-H1 with the split backward and 1F1B with the fused one, a step "
                    "of each in turn) "
                    "and write the median F, I, W and B times (ms), activation and weight-gradient bytes per "
                    "stage and the transfer time per link as a JSON cost file for simulate/show/optimize --costs.")
    parser.add_argument("model", metavar="MODEL.py", help="a Python file defining pipeforge_model(stages)")
    parser.add_argument("--stages", type=int, help="number of stages (one local process each; required but with "
                                                   "--per-layer)")
    parser.add_argument("--per-layer", action="store_true",
                        help="measure each layer of MODEL.py's whole model instead (a function pipeforge_layers(): "
                             "docs/profile.md) in this process, cut one stage per layer by pipeforge.split, and write "
                             "the layer cost file pipeforge plan reads")
    parser.add_argument("--repeats", type=int, default=5, help="with --per-layer: measured rounds (default 5)")
    parser.add_argument("--microbatches", type=int, help="microbatches per step (default 2 * STAGES)")
    parser.add_argument("--steps", type=int, default=3, help="measured steps (default 3)")
    parser.add_argument("--warmup", type=int, default=3,
                        help="steps of each schedule run first and not measured (default 3: the allocator settles)")
    parser.add_argument("--timeout", type=float, metavar="S",
                        help="seconds any rank may wait for a peer before failing (default 120, times the machine's "
                             "load per core or PIPEFORGE_TIME_SCALE)")
    parser.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                        help="time each F, I, W, B by the wall clock (default) or by its thread's CPU time "
                             "(CPU only: the work itself, steadier on a loaded machine)")
    parser.add_argument("--pin", action="store_true",
                        help="keep each rank on a core of its own (where there are at least STAGES cores): "
                             "no rank waits for a core another holds")
    parser.add_argument("-o", "--output", required=True, metavar="COSTS.json", help="the cost file to write")
    add_force_argument(parser, "an existing COSTS.json")
    parser.add_argument("--json", action="store_true", help="print the cost file to stdout too")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from pipeforge.commands.run import require_torch

    require_suffix(args.output, ".json")
    if not args.force:  # refused now, not after the measuring: what it will measure is not what is there
        check_replaceable(Path(args.output))
    if args.per_layer:
        return _per_layer(args)
    _check(args)
    require_torch()
    from pipeforge.generator import codegen
    from pipeforge.library import load_library_schedule
    from pipeforge.tools.profiling import ProfileJob, cost_file
    from pipeforge.tools.launch import spawn, time_scale
    from pipeforge.sim.costfile import cost_file_from_json

    base = PROFILE_TIMEOUT if args.timeout is None else args.timeout
    timeout = PROFILE_TIMEOUT * time_scale() if args.timeout is None else args.timeout

    microbatches = args.microbatches if args.microbatches is not None else 2 * args.stages
    schedule = load_library_schedule("zb-h1", {"P": args.stages, "M": microbatches})
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="pipeforge-profile-") as out_dir:
        fused = load_library_schedule("1f1b", {"P": args.stages, "M": microbatches})
        (Path(out_dir) / "fused").mkdir()
        job = ProfileJob(str(Path(args.model).resolve()), str(codegen(schedule, out_dir)),
                         str(codegen(fused, str(Path(out_dir) / "fused"))), steps=args.steps,
                         warmup=args.warmup, timeout=timeout, clock=args.clock, pin=args.pin)
        outcomes = spawn("pipeforge.tools.profiling:profile_job", args.stages, job, timeout=timeout,
                         deadline=base * (args.steps + args.warmup + 2) + 30)  # idle seconds: spawn scales it
    failed = [o for o in outcomes if not o.ok]
    if failed:
        for outcome in failed:
            print(f"rank {outcome.rank} (stage {outcome.rank}): {outcome.error.strip().splitlines()[-1]}",
                  file=sys.stderr)
        return Exit.USAGE if any("ModelFileError" in o.error for o in failed) else Exit.INVALID
    unpinned = [o.rank for o in outcomes if not o.value.get("pinned", True)]
    if unpinned:
        print(f"warning: --pin: rank {', '.join(map(str, unpinned))} could not be kept on a core of its own "
              f"({usable_cores()} usable cores for {args.stages} ranks, or no CPU affinity here); ranks may share "
              f"cores", file=sys.stderr)
    data = cost_file([o.value for o in outcomes])
    cost_file_from_json(data, args.output)  # what we write must read back
    write_output(args.output, json.dumps(data, indent=2) + "\n", force=args.force)
    if args.json:
        print_json(data)
        return Exit.OK
    print(summary(data, args, time.monotonic() - started))
    return Exit.OK


def usable_cores() -> int | str:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else "unknown"


def _per_layer(args: argparse.Namespace) -> int:
    """``--per-layer``: ``pipeforge.models.profile.layer_costs`` on the file's model, written as plan reads it."""
    from pipeforge.commands.run import require_torch
    from pipeforge.files import require_regular_file

    if args.stages is not None:
        raise UsageError("--per-layer measures one stage per layer: leave --stages out")
    if args.repeats < 1:
        raise UsageError(f"--repeats {args.repeats}: expected at least 1")
    require_regular_file(args.model, "Python file defining pipeforge_layers()")
    require_torch()
    from pipeforge.models.profile import layer_costs, load_layer_model
    from pipeforge.plan import layer_costs_from_json

    if args.microbatches is not None and args.microbatches < 1:
        raise UsageError(f"--microbatches {args.microbatches}: expected at least 1")
    started = time.monotonic()
    found = load_layer_model(args.model)
    batch, mask = found["batch"], found.get("attention_mask")
    if args.microbatches is not None:  # one microbatch's rows, as the pipeline will run each layer
        batch, mask = microbatch_of(batch, args.microbatches, "batch"), \
            None if mask is None else microbatch_of(mask, args.microbatches, "attention_mask")
    data = layer_costs(found["model"], batch, attention_mask=mask, repeats=args.repeats)
    layer_costs_from_json(data, args.output)  # what we write, plan must read
    write_output(args.output, json.dumps(data, indent=2) + "\n", force=args.force)
    if args.json:
        print_json(data)
        return Exit.OK
    lines = [f"profiled {printable(args.model)}: {len(data['layers'])} layers, {args.repeats} rounds in "
             f"{time.monotonic() - started:.1f} s (times in ms, memory in bytes)",
             f"{'layer':>6}{'F':>10}{'I':>10}{'W':>10}{'activation':>14}{'parameters':>14}"]
    rows = [(str(i), e) for i, e in enumerate(data["layers"])] + [("first", data["first"]), ("last", data["last"])]
    for name, e in rows:
        lines.append(f"{name:>6}{e['F']:>10.3f}{e['I']:>10.3f}{e['W']:>10.3f}{e.get('activation', 0):>14.0f}"
                     f"{e['parameters']:>14.0f}")
    lines.append(f"wrote {printable(args.output)}")
    print("\n".join(lines))
    return Exit.OK


def microbatch_of(tensor, microbatches: int, name: str):
    """The first of ``microbatches`` row chunks of ``tensor`` (the runtime's split: rows divided as evenly as
    they go), refused where there are fewer rows than microbatches."""
    if tensor.shape[0] < microbatches:
        raise UsageError(f"--microbatches {microbatches}: the model file's {name} has only {tensor.shape[0]} rows")
    return tensor.tensor_split(microbatches)[0]


def _check(args: argparse.Namespace) -> None:
    if args.stages is None:
        raise UsageError("--stages N is required (or --per-layer)")
    if args.stages < 2:
        raise UsageError(f"--stages {args.stages}: expected at least 2 (one local process per stage)")
    if args.microbatches is not None and args.microbatches < 1:
        raise UsageError(f"--microbatches {args.microbatches}: expected at least 1")
    if args.steps < 1 or args.warmup < 0:
        raise UsageError("--steps must be at least 1 and --warmup at least 0")
    if args.timeout is not None and not 0 < args.timeout < float("inf"):
        raise UsageError(f"--timeout {args.timeout:g}: expected a positive number of seconds")
    from pipeforge.files import require_regular_file

    require_regular_file(args.model, "Python file defining pipeforge_model(stages)")


def summary(data: dict, args: argparse.Namespace, seconds: float) -> str:
    lines = [f"profiled {printable(args.model)}: {args.stages} stages, {args.steps} measured steps in {seconds:.1f} s "
             f"(times in ms, memory in bytes)",
             f"{'stage':>5}{'F':>10}{'I':>10}{'W':>10}{'B':>10}{'activation':>14}{'weight_grad':>14}"]
    for s, e in enumerate(data["stages"]):
        lines.append(f"{s:>5}{e['F']:>10.3f}{e['I']:>10.3f}{e['W']:>10.3f}{e['B']:>10.3f}{e['activation']:>14.0f}"
                     f"{e['weight_grad']:>14.0f}")
    lines.append("links " + " ".join(f"{s}->{s + 1}: {t:.3f}" for s, t in enumerate(data["links"])))
    if "step" in data:
        lines.append(f"runtime: {data.get('dispatch', 0):.3f} an action, {data['step']:.3f} a step beyond its actions; "
                     "summing a stage's gradients across two chains " + " ".join(f"{t:.3f}" for t in data["chain_sum"]))
    lines.append(f"wrote {printable(args.output)}")
    return "\n".join(lines)
