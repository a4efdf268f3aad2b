"""``pipeforge fmt PATH [-D NAME=VALUE]... [--schedule NAME] [-o OUT]``: the canonical .pipe form.

Elaborates the schedule and prints it explicitly (every rank's steps as torch
tokens), or writes it atomically to OUT (replacing a file there only when it
defines the same schedules, or with ``--force``). Exit 2 on bad input.
"""

from __future__ import annotations

import argparse

from pipeforge.commands.common import (add_force_argument, add_input_arguments, load_input, print_or_write_source,
                                       require_suffix)


def register(subparsers) -> None:
    parser = subparsers.add_parser("fmt", help="print a schedule in canonical, explicit .pipe form",
                                   description=__doc__.split("\n\n")[0])
    add_input_arguments(parser)
    parser.add_argument("-o", "--output", metavar="OUT", help="write to OUT (atomically) instead of stdout")
    add_force_argument(parser, "an existing OUT")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    if args.output is not None:
        require_suffix(args.output, ".pipe")
    from pipeforge.lang.printer import print_schedule  # lark only when used: 'pipeforge verify x.csv' starts faster

    return print_or_write_source(args.output, print_schedule(load_input(args)), args.force)

