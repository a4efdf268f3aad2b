"""``pipeforge new NAME``: write a library schedule out as a ``.pipe`` file to edit.

``-D P=8`` becomes the file's default, so the file elaborates the same with no
``-D``. Without ``-o`` the source goes to stdout; with it, the file is written
atomically (a temporary file beside it, then a rename). As with ``codegen``, an
existing file is replaced only when it is the source of the same schedule (the
same schedule names), otherwise only with ``--force``.
"""

from __future__ import annotations

import argparse

from pipeforge.commands.common import add_force_argument, parse_defines, print_or_write_source, require_suffix


def register(subparsers) -> None:
    parser = subparsers.add_parser("new", help="write a library schedule as a .pipe file",
                                   description="Write the .pipe source of a built-in schedule, with -D "
                                               "values as its new parameter defaults.")
    parser.add_argument("name", metavar="NAME", help="a library schedule (see 'pipeforge library')")
    parser.add_argument("-D", dest="defines", action="append", default=[], metavar="NAME=VALUE",
                        help="set a parameter's default (repeatable)")
    parser.add_argument("-o", "--output", metavar="FILE", help="where to write (default: stdout)")
    add_force_argument(parser, "an existing FILE")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from pipeforge import library

    if args.output is not None:
        require_suffix(args.output, ".pipe")
    return print_or_write_source(args.output, library.source_with_defaults(args.name, parse_defines(args.defines)),
                                 args.force)
