"""The ``pipeforge`` command: arguments in, library calls, printing and exit codes out.

Each subcommand lives in ``pipeforge/commands/<name>.py`` with ``register(subparsers)``
that adds its parser and sets ``handler`` to a function ``(args) -> int``.
Exit codes (a contract): ``pipeforge.commands.exits.Exit``. Library errors name the
arguments of a call; they are printed with the flags that set them
(``pipeforge.commands.wording``).
"""

from __future__ import annotations

import argparse
import errno
import importlib
import sys

from pipeforge.commands import wording
from pipeforge.commands.common import StoreOnce, refuse_output_over_input
from pipeforge.commands.exits import Exit
from pipeforge._gc import gc_paused
from pipeforge.errors import PipeforgeError, VerificationError

COMMANDS = ("verify", "fmt", "convert", "lower", "library", "new", "simulate", "show", "optimize", "codegen", "run",
            "profile", "diagnose", "plan", "export")

class _Parser(argparse.ArgumentParser):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.register("action", None, StoreOnce)  # a value option given twice is refused, not last-wins
        self.register("action", "store", StoreOnce)

    def error(self, message: str):  # argparse's own usage errors exit 2 already; keep the text short
        self.print_usage(sys.stderr)
        self.exit(Exit.USAGE, f"{self.prog}: error: {message}\n")


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    """The parser of every command; only that of ``argv``'s command when it starts with one (start-up:
    each command's module imports what it needs, and ``verify`` of a large CSV must start quickly)."""
    parser = _Parser(prog="pipeforge", description="Formally checked pipeline-parallel schedules.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True
    for name in (argv[0],) if argv and argv[0] in COMMANDS else COMMANDS:
        try:
            module = importlib.import_module(f"pipeforge.commands.{name}")
        except ModuleNotFoundError as missing:
            if missing.name != f"pipeforge.commands.{name}":
                raise
            continue
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    with gc_paused():  # a command builds ~10^5 small acyclic values (_gc.py); a library call never pauses it
        return _main(argv)


def _main(argv: list[str] | None) -> int:
    if argv is None:
        argv = sys.argv[1:]
    args = build_parser(argv).parse_args(argv)
    try:
        refuse_output_over_input(args)
        code = args.handler(args)
        if sys.stdout is not None:  # None when started with stdout closed
            sys.stdout.flush()  # a full disk or a closed pipe is this command's error, not the interpreter's at exit
        return code
    except VerificationError as error:
        print(wording.render(error), file=sys.stderr)
        return Exit.INVALID
    except PipeforgeError as error:
        print(wording.render(error), file=sys.stderr)
        return Exit.USAGE
    except KeyboardInterrupt:
        return Exit.INTERRUPTED
    except BrokenPipeError:
        # `pipeforge library | head`: the reader went away; say nothing more.
        _silence_stdout()
        return Exit.OK
    except OSError as error:
        if error.filename is None and error.errno in _WRITE_ERRORS:
            # stdout could not take the output: `pipeforge library > /dev/full`
            _silence_stdout()
            print(f"error: cannot write the output: {error.strerror or error}", file=sys.stderr)
            return Exit.USAGE
        if error.filename is None:
            return _report_bug()
        # A file the user named could not be read or written (permissions, a full disk, ...).
        print(f"error: {error.filename!r}: {error.strerror or error}", file=sys.stderr)
        return Exit.USAGE
    except Exception:
        return _report_bug()


_WRITE_ERRORS = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EIO, errno.EROFS, errno.EBADF}


def _report_bug() -> int:
    """An internal error: keep the traceback, and say whose fault it is."""
    import traceback

    traceback.print_exc()
    print("this is a bug in pipeforge, not in your input; please report it with the command line above",
          file=sys.stderr)
    return Exit.BUG


def _silence_stdout() -> None:
    import os

    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())


if __name__ == "__main__":
    sys.exit(main())
