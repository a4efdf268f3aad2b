"""``pipeforge new NAME``: write a library schedule out as a ``.pipe`` file to edit.

``-D P=8`` becomes the file's default, so the file elaborates the same with no
``-D``. Without ``-o`` the source goes to stdout; with it, the file is written
atomically (a temporary file beside it, then a rename). As with ``codegen``, an
existing file is replaced only when it is the source of the same schedule (the
same schedule names), otherwise only with ``--force``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from pipeforge.commands.common import parse_defines, require_suffix
from pipeforge.commands.exits import Exit
from pipeforge.errors import UsageError
from pipeforge.files import write_atomically


def register(subparsers) -> None:
    parser = subparsers.add_parser("new", help="write a library schedule as a .pipe file",
                                   description="Write the .pipe source of a built-in schedule, with -D "
                                               "values as its new parameter defaults.")
    parser.add_argument("name", metavar="NAME", help="a library schedule (see 'pipeforge library')")
    parser.add_argument("-D", dest="defines", action="append", default=[], metavar="NAME=VALUE",
                        help="set a parameter's default (repeatable)")
    parser.add_argument("-o", "--output", metavar="FILE", help="where to write (default: stdout)")
    parser.add_argument("--force", action="store_true",
                        help="replace an existing file even if it is not the source of this schedule")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from pipeforge import library

    if args.output is not None:
        require_suffix(args.output, ".pipe")
    text = library.source_with_defaults(args.name, parse_defines(args.defines))
    if args.output is None:
        sys.stdout.write(text)
        return Exit.OK
    write_atomically(Path(args.output), text,
                     replaceable=None if args.force else lambda target: _check_replaceable(target, text))
    return Exit.OK


def _check_replaceable(target: Path, text: str) -> None:
    """Refuse to replace a file that is not the .pipe source of the schedules ``text`` holds."""
    from pipeforge.errors import PipeforgeError
    from pipeforge.lang import schedule_names

    if not target.exists():
        return
    ours = schedule_names(text)
    try:
        held = schedule_names(target)
    except PipeforgeError:  # not a .pipe file, unreadable, too large: not ours
        held = None
    if held == ours:
        return
    what = "is not a .pipe file" if held is None else \
        f"holds schedule{'s' if len(held) != 1 else ''} {', '.join(map(repr, held)) or 'none'}"
    raise UsageError(f"{str(target)!r} exists and {what}; this is schedule {', '.join(map(repr, ours))}. "
                     "Pass --force to replace it, or name another file")
