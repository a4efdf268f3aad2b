"""``pipeforge export torchtitan PATH -o OUTDIR``: the CSV and ``[parallelism]`` settings torchtitan runs."""

from __future__ import annotations

import argparse
import sys

from pipeforge.commands.common import add_force_argument, add_input_arguments, load_input, print_json
from pipeforge.commands.common import refuse_output_over_input
from pipeforge.commands.exits import Exit
from pipeforge.commands.wording import message
from pipeforge.errors import UsageError, printable


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "export", help="write a schedule for another launcher (torchtitan)",
        description="Write OUTDIR/<name>.csv and OUTDIR/<name>.toml: the compute-only CSV torchtitan loads "
                    "(pipeline_parallel_schedule_csv) and the [parallelism] and [training] settings that make its "
                    "launcher build the stages the CSV places, checked with verify --as torchtitan; or refuse, "
                    "with the reason, a schedule torchtitan cannot run (exit 1, nothing written).")
    parser.add_argument("target", choices=("torchtitan",), help="the launcher")
    add_input_arguments(parser)
    parser.add_argument("-o", "--output", dest="out_dir", required=True, metavar="OUTDIR",
                        help="folder to write into (created if missing)")
    parser.add_argument("--layers", type=int, metavar="N",
                        help="the model's layer count: writes module_fqns_per_model_part (torchtitan's LLM split) "
                             "where its default stage count is not the schedule's")
    parser.add_argument("--microbatch-size", type=int, default=1, metavar="K",
                        help="pipeline_parallel_microbatch_size (local_batch_size = microbatches x K)")
    add_force_argument(parser, "existing files in OUTDIR")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from pipeforge.interop.torchtitan_export import (
        ExportRefusal,
        format_stages,
        plan_export,
    )

    for flag, value in (("--layers", args.layers), ("--microbatch-size", args.microbatch_size)):
        if value is not None and not 1 <= value <= 1_000_000:
            raise UsageError(f"{flag} {value}: expected 1 to 1000000")
    schedule = load_input(args)
    try:
        plan = plan_export(schedule, layers=args.layers, microbatch_size=args.microbatch_size)
    except ExportRefusal as refused:
        if args.json:
            print_json({"exported": False, "refused": message(refused), "files": []})
        else:
            print(f"refused: {message(refused)}", file=sys.stderr)
        return Exit.INVALID
    refuse_output_over_input(args, tuple(str(path) for path in plan.paths(args.out_dir)))
    written = plan.write(args.out_dir, force=args.force)
    if args.json:
        print_json({"exported": True, "refused": None, "files": [str(p) for p in written],
                    "settings": plan.settings, "stages": {str(r): list(s) for r, s in plan.stages.items()}})
    else:
        print(f"wrote {printable(str(written[0]))} and {printable(str(written[1]))} (pipeline_parallel_schedule = "
              f"{plan.settings['parallelism']['pipeline_parallel_schedule']!r}; {format_stages(plan.stages)})")
    return Exit.OK
