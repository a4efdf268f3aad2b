"""``pipeforge convert IN OUT``: .pipe, torch CSV and Chrome trace, by the output's suffix.

- ``OUT.csv``: torch CSV (``--format compute_only`` or ``compute_comms``; by
  default ``compute_comms`` when the input spells out communication, else
  ``compute_only``);
- ``OUT.pipe``: canonical ``.pipe`` source (``pipeforge.lang.printer``);
- ``OUT.json``: a Chrome/Perfetto trace (``pipeforge.interop.chrome_trace``).

The output is written atomically: on any error nothing is left at OUT. A file
already at OUT is replaced only when it holds the same (schedules by name for
``.pipe``, the same bytes otherwise), or with ``--force``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from pipeforge.commands.common import add_force_argument, add_input_arguments, load_input, suffix_problem, write_source
from pipeforge.commands.exits import Exit
from pipeforge.errors import UsageError
from pipeforge.files import write_output
from pipeforge.ir import Schedule

SUFFIXES = (".csv", ".pipe", ".json")


def register(subparsers) -> None:
    parser = subparsers.add_parser("convert", help="convert between .pipe, torch CSV and Chrome trace .json",
                                   description=__doc__.split("\n\n")[0])
    add_input_arguments(parser)
    parser.add_argument("out", metavar="OUT", help="the output: OUT.csv, OUT.pipe or OUT.json")
    parser.add_argument("--format", choices=("compute_only", "compute_comms"),
                        help="torch CSV form to write (default: compute_comms if the input has communication)")
    add_force_argument(parser, "an existing OUT")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    suffix = Path(args.out).suffix
    if suffix not in SUFFIXES:
        raise UsageError(f"{args.out!r}: the output {suffix_problem('.csv, .pipe or .json', suffix)}")
    if args.format and suffix != ".csv":
        raise UsageError(f"--format applies to a .csv output, not {suffix!r}")
    schedule = load_input(args)
    if suffix == ".pipe":
        write_source(args.out, render(schedule, suffix, args.format), args.force)
    elif suffix == ".json":
        from pipeforge.interop.chrome_trace import trace_text

        write_output(args.out, trace_text(schedule), force=args.force)
    else:
        write_output(args.out, render(schedule, suffix, args.format), force=args.force)
    return Exit.OK


def render(schedule: Schedule, suffix: str, format: str | None) -> str:
    if suffix == ".csv":
        from pipeforge.interop.torch_csv import has_communication, to_csv_text

        chosen = format or ("compute_comms" if has_communication(schedule) else "compute_only")
        return to_csv_text(schedule, chosen)
    try:
        from pipeforge.lang.printer import print_schedule
    except ImportError as missing:
        raise UsageError(f".pipe output is not available in this installation ({missing})") from None
    return print_schedule(schedule)

