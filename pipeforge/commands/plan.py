"""``pipeforge plan``: layers per stage and the schedule together, from per-layer costs (``pipeforge.plan``).

Writes the chosen schedule's ``.pipe`` source (``-o``, its parameters as the
defaults) and the layer map (``--layer-map``, default beside it:
``OUT.layers.json``), the layer counts ``pipeforge.split(..., layers=...)``
takes; prints the predicted step, the even split's on the same schedule and the
lower bound. An existing output is replaced only when it holds the same (the
same schedule by name; the same bytes for the layer map), or with ``--force``;
both files or neither.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from pipeforge.commands.common import add_force_argument, print_json, require_suffix
from pipeforge.commands.exits import Exit
from pipeforge.errors import UsageError, printable


def register(subparsers) -> None:
    parser = subparsers.add_parser("plan", help="choose layers per stage and the schedule from per-layer costs",
                                   description="Choose the layers of each stage and the library schedule with the "
                                               "shortest simulated step, from a layer cost file.")
    parser.add_argument("layer_costs", metavar="LAYER_COSTS.json", help="per-layer costs (docs/models.md)")
    parser.add_argument("--ranks", type=int, required=True, metavar="P", help="pipeline ranks")
    parser.add_argument("--microbatches", type=int, required=True, metavar="M", help="microbatches per step")
    parser.add_argument("--schedules", metavar="A,B", help="library schedules to try (default: all that accept P, M)")
    parser.add_argument("--memory-limit", type=float, metavar="X",
                        help="activation memory limit per rank, in M_B (the largest stage's activation)")
    parser.add_argument("-o", "--output", required=True, metavar="OUT.pipe", help="the chosen schedule's source")
    parser.add_argument("--layer-map", metavar="FILE.json", help="where the layer map goes (default OUT.layers.json)")
    add_force_argument(parser, "existing outputs")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from pipeforge import library
    from pipeforge.files import write_outputs
    from pipeforge.lang import held_schedules
    from pipeforge.plan import plan, read_layer_costs

    require_suffix(args.output, ".pipe")
    if args.ranks < 1 or args.microbatches < 1:
        raise UsageError("--ranks and --microbatches must be positive")
    out = Path(args.output)
    layer_map = Path(args.layer_map) if args.layer_map else out.with_suffix(".layers.json")
    chosen = [s.strip() for s in args.schedules.split(",") if s.strip()] if args.schedules else None
    result = plan(read_layer_costs(args.layer_costs), args.ranks, args.microbatches, chosen, args.memory_limit)
    write_outputs([(out, library.source_with_defaults(result.schedule, result.defines)),
                   (layer_map, json.dumps(result.to_json(), indent=2) + "\n")], force=args.force, held=held_schedules)
    if args.json:
        print_json({**result.to_json(), "output": str(out), "layer_map": str(layer_map)})
        return Exit.OK
    units = f" {result.units}" if result.units else ""
    print(f"{result.schedule} (P={args.ranks}, M={args.microbatches}), layers {list(result.layers)}: "
          f"step {result.step:g}{units} (even split {list(result.even_layers)}: {result.even_step:g}{units}; "
          f"lower bound {result.lower_bound:g}{units})")
    print(f"wrote {printable(str(out))} and {printable(str(layer_map))}")
    return Exit.OK

