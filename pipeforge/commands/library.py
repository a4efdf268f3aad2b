"""``pipeforge library``: the built-in schedules, their one-line descriptions and parameters."""

from __future__ import annotations

import argparse

from pipeforge.commands.common import print_json
from pipeforge.commands.exits import Exit


def register(subparsers) -> None:
    parser = subparsers.add_parser("library", help="list the built-in schedules",
                                   description="List the built-in schedules with their descriptions and "
                                               "parameters; 'pipeforge new NAME' writes one out.")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.set_defaults(handler=run)


def entries() -> list[dict]:
    from pipeforge import library

    rows = []
    for name in library.names():
        description, params = library.describe(name)
        rows.append({"name": name, "description": description,
                     "parameters": [{"name": param, "default": default} for param, default in params]})
    return rows


def run(args: argparse.Namespace) -> int:
    rows = entries()
    if args.json:
        print_json({"schedules": rows})
        return Exit.OK
    params = [" ".join(f"{p['name']}={p['default']}" for p in row["parameters"]) for row in rows]
    name_width = max(len(row["name"]) for row in rows)
    param_width = max(map(len, params))
    for row, param_text in zip(rows, params):
        print(f"{row['name']:<{name_width}}  {param_text:<{param_width}}  {row['description']}")
    return Exit.OK
