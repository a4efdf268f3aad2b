"""``pipeforge show PATH -o OUT``: the simulated timeline as a picture, a grid, or a trace.

The output's suffix picks the form: ``.svg``, ``.png`` (needs the ``png`` extra),
``.html`` (self-contained, with tooltips), ``.txt`` (the terminal grid) or
``.json`` (a Chrome/Perfetto trace). Files are written atomically; a file at OUT
is replaced only by the same bytes, or with ``--force``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from pipeforge.commands.simulate import add_cost_arguments, simulate_input
from pipeforge.commands.common import add_force_argument, add_input_arguments, check_width, suffix_problem
from pipeforge.commands.exits import Exit
from pipeforge.errors import UsageError

SUFFIXES = (".svg", ".png", ".html", ".txt", ".json")


def register(subparsers) -> None:
    parser = subparsers.add_parser("show", help="draw a schedule's simulated timeline",
                                   description="Simulate a schedule and draw its timeline as SVG, PNG, "
                                               "HTML, a text grid, or a Chrome trace (.json).")
    add_input_arguments(parser)
    add_cost_arguments(parser)
    parser.add_argument("-o", "--output", required=True, metavar="OUT",
                        help="OUT.svg, OUT.png, OUT.html, OUT.txt or OUT.json (Chrome trace)")
    add_force_argument(parser, "an existing OUT")
    parser.add_argument("--title", help="the picture's title (default: name, bubble rate, makespan, memory)")
    parser.add_argument("--width", type=int, default=None,
                        help="time-axis width: pixels for pictures (default: fitted), columns for .txt (default 100)")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    suffix = Path(args.output).suffix.lower()
    if suffix not in SUFFIXES:
        raise UsageError(f"-o {args.output!r}: the output {suffix_problem(', '.join(SUFFIXES), suffix)}")
    check_width(args.width)
    timeline = simulate_input(args)
    write_picture(timeline, args.output, suffix, title=args.title, width=args.width, force=args.force)
    return Exit.OK


def write_picture(timeline, path: str, suffix: str, *, title: str | None = None, width: int | None = None,
                  force: bool = False) -> None:
    """The picture at ``path``: a file there is replaced only by the same bytes, or with ``force``."""
    from pipeforge.files import write_output

    write_output(path, picture(timeline, suffix, title=title, width=width), force=force)


def picture(timeline, suffix: str, *, title: str | None = None, width: int | None = None) -> bytes | str:
    if suffix == ".png":
        from pipeforge.render.png import png_bytes

        return png_bytes(timeline, title=title)
    if suffix == ".json":
        from pipeforge.interop.chrome_trace import trace_text

        return trace_text(timeline)
    return _text_picture(timeline, suffix, title, width)


def _text_picture(timeline, suffix: str, title: str | None, width: int | None) -> str:
    if suffix == ".txt":
        from pipeforge.render.grid import render_text

        return render_text(timeline, width=width or 100)
    if suffix == ".html":
        from pipeforge.render.html import render_html

        return render_html(timeline, title=title)
    from pipeforge.render.svg import render_svg

    return render_svg(timeline, title=title, width=float(width) if width else None)
