"""Arguments shared by several subcommands, and loading a schedule from what the user named."""

from __future__ import annotations

import argparse
import sys

from pipeforge.commands.exits import Exit
from pipeforge.errors import UsageError


class StoreOnce(argparse.Action):
    """argparse's ``store``, refusing an option given twice with both values (its last one silently won)."""

    def __call__(self, parser, namespace, values, option_string=None):
        given = vars(namespace).setdefault("_options_given", {})
        if self.dest in given:
            raise argparse.ArgumentError(self, f"given twice, first {given[self.dest]!r}, then {values!r}: "
                                               "give it once")
        given[self.dest] = values
        setattr(namespace, self.dest, values)


class JoinItems(argparse.Action):
    """A comma-separated option (``--cost F=1,I=2``) given again adds its items: ``--cost F=1 --cost I=2``
    is ``F=1,I=2``, and the reader of the items refuses a name given twice in either form."""

    def __call__(self, parser, namespace, values, option_string=None):
        before = getattr(namespace, self.dest, None)  # the default is None
        setattr(namespace, self.dest, values if before is None else f"{before},{values}")


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
    first: dict[str, str] = {}
    for item in items:
        name, eq, value = item.partition("=")
        name = name.strip()
        if not eq or not (name.isascii() and name.isidentifier()):  # as the language's names
            raise UsageError(f"-D {item!r}: expected NAME=VALUE, like -D P=8")
        if name in first:  # the last one silently won
            raise UsageError(f"-D {item!r}: {name} is given twice, first as -D {first[name]!r}")
        first[name] = item
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
        raise UsageError(f"-o {output!r}: the output is {suffix} source and {suffix_problem(suffix, found)}")


def suffix_problem(wanted: str, found: str) -> str:
    """What is wrong with an output's suffix ``found`` (``""``: none) where ``wanted`` names the ones it may have."""
    return f"must end in {wanted}, not {found!r}" if found else f"must end in {wanted} (it has no suffix)"


MAX_WIDTH = 10_000


def check_width(width: int | None) -> None:
    """--width: columns or pixels; a mistyped 100000000 must not write gigabytes."""
    if width is not None and not 0 <= width <= MAX_WIDTH:
        raise UsageError(f"--width {width}: expected 0 to {MAX_WIDTH} (columns or pixels)")


def add_force_argument(parser: argparse.ArgumentParser, what: str = "an existing output") -> None:
    """--force: replace ``what`` even where the replacement rule (``files.check_replaceable``) refuses."""
    parser.add_argument("--force", action="store_true",
                        help=f"replace {what} even if it is not the same output (another schedule, other bytes)")


def write_source(path: str, text: str, force: bool) -> None:
    """Write .pipe source ``text`` to ``path``: a file there is replaced only when it defines the same
    schedules (by name), or with --force."""
    from pipeforge.files import write_output
    from pipeforge.lang import held_schedules

    write_output(path, text, force=force, held=held_schedules)


def print_or_write_source(output: str | None, text: str, force: bool) -> int:
    """``text`` to stdout where there is no ``output``, else written there (``write_source``): exit 0."""
    if output is None:
        sys.stdout.write(text)
    else:
        write_source(output, text, force)
    return Exit.OK


OUTPUT_ATTRIBUTES = ("output", "out", "out_dir", "layer_map")  # -o / OUT of the commands that write a file
INPUT_ATTRIBUTES = ("path", "model", "layer_costs", "cost_file")  # the files they read


def refuse_output_over_input(args: argparse.Namespace, outputs: tuple[str, ...] = ()) -> None:
    """An output that is an input file itself (or a link to it) would replace what is being read:
    refused, forced or not. ``outputs``: files a command writes that no flag names (export's)."""
    import os

    inputs = [path for path in (getattr(args, name, None) for name in INPUT_ATTRIBUTES)
              if isinstance(path, str) and os.path.isfile(path)]
    named = [getattr(args, attribute, None) for attribute in OUTPUT_ATTRIBUTES]
    for output in [*named, *outputs]:
        for path in inputs:
            try:
                same = output is not None and os.path.samefile(path, output)
            except OSError:  # the output does not exist yet, or cannot be looked at: the write decides
                same = False
            if same:
                raise UsageError(f"the output {str(output)!r} is the input {path!r}: writing it would replace what "
                                 "is being read; name another output file")


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
