"""``pipeforge codegen``: write the per-rank PyTorch module of a verified schedule."""

from __future__ import annotations

import argparse

from pipeforge.commands.common import add_input_arguments, print_json
from pipeforge.commands.exits import Exit
from pipeforge.errors import printable
from pipeforge.commands.lower import add_pass_arguments, load_with_passes, pass_options, semantics_for


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "codegen", help="write a PyTorch module that runs the schedule",
        description="Lower (if compute-only) and verify the schedule, then write OUT/<name>.py (or OUT itself "
                    "when it ends in .py), with make_pipeline(stage_modules, ...), and beside it the folder "
                    "<name>_ranks_<digest> with one module per rank (rank_<r>.py). "
                    "Refuses a schedule that does not verify, and replacing a file that holds another "
                    "schedule's module (or anything else) without --force.")
    add_input_arguments(parser)
    add_pass_arguments(parser)
    parser.add_argument("-o", "--output", dest="out_dir", required=True, metavar="OUT",
                        help="folder to write the module into (created if missing), or the module file NAME.py")
    parser.add_argument("--name", metavar="NAME",
                        help="module name (a Python identifier) when OUT is a folder; default: the schedule's name")
    parser.add_argument("--force", action="store_true",
                        help="replace an existing file even if it holds another schedule's module")
    parser.add_argument("--no-locations", action="store_true",
                        help="leave the per-step comments (torch token, .pipe file:line:col, verify's step "
                             "index) out (stable golden files)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from pipeforge.generator import codegen, rank_folder

    schedule = load_with_passes(args)  # (pipeforge.cli.main pauses the collector for the command)
    path = codegen(schedule, args.out_dir, locations=not args.no_locations, name=args.name, force=args.force,
                   semantics=semantics_for(pass_options(args)))
    if args.json:
        print_json({"schedule": schedule.name, "module": str(path), "ranks": schedule.ranks,
                    "rank_folder": str(rank_folder(path))})
    else:
        print(f"wrote {printable(str(path))} (schedule {schedule.name!r}, {schedule.ranks} ranks)")
    return Exit.OK
