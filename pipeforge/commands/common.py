"""Arguments shared by several subcommands, and loading a schedule from what the user named."""

from __future__ import annotations

import argparse
import sys

from pipeforge.errors import UsageError


def add_input_arguments(parser: argparse.ArgumentParser, placement_flag: str = "--placement") -> None:
    """PATH, -D NAME=VALUE, --schedule NAME, and the CSV inference overrides (``placement_flag`` names the
    CSV input's placement flag: ``optimize`` keeps ``--placement`` for the placement it may choose)."""
    parser.add_argument("path", metavar="PATH", help="a .pipe file, a torch schedule CSV, or a library schedule name")
    parser.add_argument("-D", dest="defines", action="append", default=[], metavar="NAME=VALUE",
                        help="override a schedule parameter (repeatable)")
    parser.add_argument("--schedule", metavar="NAME", help="which schedule of a file holding several")
    parser.add_argument("--stages", type=int, help="CSV input: number of stages (inferred by default)")
    parser.add_argument("--microbatches", type=int, help="CSV input: number of microbatches (inferred by default)")
    parser.add_argument(placement_flag, dest="input_placement", help="CSV input: loop or v (inferred by default)")


def parse_defines(items: list[str]) -> dict[str, int]:
    defines: dict[str, int] = {}
    for item in items:
        name, eq, value = item.partition("=")
        name = name.strip()
        if not eq or not (name.isascii() and name.isidentifier()):  # as the language's names
            raise UsageError(f"-D {item!r}: expected NAME=VALUE, like -D P=8")
        try:
            if not value.strip().lstrip("+-").isascii():  # int() also takes other scripts' digits
                raise ValueError(value)
            defines[name] = int(value.strip(), 10)
        except ValueError:
            raise UsageError(f"-D {item!r}: the value of {name!r} must be an integer, got {value.strip()!r}") from None
    return defines


def require_suffix(output: str, suffix: str) -> None:
    """Refuse ``-o OUT`` whose extension does not name what the command writes."""
    from pathlib import Path

    found = Path(output).suffix
    if found != suffix:
        raise UsageError(f"-o {output!r}: the output is {suffix} source and must end in {suffix}, "
                         f"not {found or 'nothing'!r}")


MAX_WIDTH = 10_000


def check_width(width: int | None) -> None:
    """--width: columns or pixels; a mistyped 100000000 must not write gigabytes."""
    if width is not None and not 0 <= width <= MAX_WIDTH:
        raise UsageError(f"--width {width}: expected 0 to {MAX_WIDTH} (columns or pixels)")


OUTPUT_ATTRIBUTES = ("output", "out", "out_dir")  # -o / OUT of the commands that write a file


def refuse_output_over_input(args: argparse.Namespace) -> None:
    """An output that is the input file itself (or a link to it) would replace the schedule being read."""
    import os

    path = getattr(args, "path", None) or getattr(args, "model", None)
    if not path or not os.path.isfile(path):
        return
    for attribute in OUTPUT_ATTRIBUTES:
        output = getattr(args, attribute, None)
        try:
            same = output is not None and os.path.samefile(path, output)
        except OSError:  # the output does not exist yet, or cannot be looked at: the write decides
            same = False
        if same:
            raise UsageError(f"the output {output!r} is the input {path!r}: writing it would replace what is "
                             "being read; name another output file")


def load_input(args: argparse.Namespace):
    """The Schedule that PATH and the flags name."""
    from pipeforge.inputs import load

    return load(
        args.path,
        defines=parse_defines(args.defines),
        schedule=args.schedule,
        stages=args.stages,
        microbatches=args.microbatches,
        placement=args.input_placement,
    )


def print_json(obj: object) -> None:
    import json  # here: most commands print no JSON, and verify's start-up is timed

    json.dump(obj, sys.stdout, indent=2, sort_keys=False)
    sys.stdout.write("\n")
