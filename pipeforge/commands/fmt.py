"""``pipeforge fmt PATH [-D NAME=VALUE]... [--schedule NAME] [-o OUT]``: the canonical .pipe form.

Elaborates the schedule and prints it explicitly (every rank's steps as torch
tokens), or writes it atomically to OUT. Exit 2 on bad input.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

from pipeforge.commands.common import add_input_arguments, load_input
from pipeforge.errors import UsageError
from pipeforge.lang.printer import print_schedule


def register(subparsers) -> None:
    parser = subparsers.add_parser("fmt", help="print a schedule in canonical, explicit .pipe form",
                                   description=__doc__.split("\n\n")[0])
    add_input_arguments(parser)
    parser.add_argument("-o", "--output", metavar="OUT", help="write to OUT (atomically) instead of stdout")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    text = print_schedule(load_input(args))
    if args.output is None:
        sys.stdout.write(text)
        return 0
    try:
        write_atomically(Path(args.output), text)
    except OSError as error:
        raise UsageError(f"cannot write {args.output!r}: {error.strerror or error}") from None
    return 0


def write_atomically(path: Path, text: str) -> None:
    """Write ``text`` to a temporary file beside ``path``, then rename it over ``path``."""
    handle, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent or ".")
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as out:
            out.write(text)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
