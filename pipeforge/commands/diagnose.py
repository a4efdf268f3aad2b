"""``pipeforge diagnose DIR``: the global state of a failed or hung step and its wait cycle, from records."""

from __future__ import annotations

import argparse

from pipeforge.commands.common import print_json
from pipeforge.commands.exits import Exit
from pipeforge.errors import UsageError


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "diagnose", help="explain a failed or hung step from the records its ranks left",
        description="Read the records every rank of a generated pipeline left in DIR (make_pipeline(records=DIR) "
                    "or PIPEFORGE_RECORDS) and show where each rank was and the wait cycle on the schedule's "
                    "source, as verify shows a deadlock.")
    parser.add_argument("directory", metavar="DIR", help="the records directory")
    parser.add_argument("--module", action="append", default=[], metavar="RANK=PATH",
                        help="read rank RANK's program from PATH instead of the module its record names "
                             "(repeatable; the records' checksum is not asked of it)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.set_defaults(handler=run)


def parse_modules(items: list[str]) -> dict[int, str]:
    found: dict[int, str] = {}
    for item in items:
        rank, eq, path = item.partition("=")
        if not eq or not rank.strip().isdigit() or not rank.strip().isascii() or not path:
            raise UsageError(f"--module {item!r}: expected RANK=PATH, like --module 1=pipeline.py")
        found[int(rank)] = path
    return found


def run(args: argparse.Namespace) -> int:
    from pipeforge.tools.diagnose import diagnose

    diagnosis = diagnose(args.directory, modules=parse_modules(args.module))
    if args.json:
        print_json(diagnosis.to_json())
    else:
        print(diagnosis.render())
    return Exit.OK
