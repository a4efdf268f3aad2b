"""``pipeforge lower``: insert communication (and, when asked, FSDP and other passes), print or write the result.

    pipeforge lower PATH [--unshard K] [--reduce-grad] [--merge-bw] [--defer-recv] [--verify-each] [-o OUT.pipe|OUT.csv]

The passes run in torch's order (``pipeforge.passes.pipeline``): merge-bw, unshard,
reduce-grad, lower, defer-recv. The result is verified (under ``buffered``
semantics with ``--defer-recv``, which leaves sends waiting for late receives, as
torch's runtime allows) and written only when valid: ``.pipe`` source on stdout or
to OUT.pipe, torch's ``compute_comms`` CSV to OUT.csv.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from pipeforge.commands.common import (add_force_argument, add_input_arguments, load_input, print_json, suffix_problem,
                                       write_source)
from pipeforge.commands.exits import Exit
from pipeforge.errors import UsageError, VerificationError
from pipeforge.semantics import Semantics

SUFFIXES = (".pipe", ".csv")


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "lower", help="insert communication and the optional passes, print the result",
        description="Insert communication (and REDUCE_GRAD) and, when asked, torch's other passes in torch's order "
                    "(merge-bw, unshard, reduce-grad, lower, defer-recv); verify the result and print it as .pipe "
                    "source, or write OUT.pipe or torch's compute_comms OUT.csv. Nothing is written when it does "
                    "not verify.")
    add_input_arguments(parser)
    add_pass_arguments(parser)
    parser.add_argument("-o", "--output", metavar="OUT", help="OUT.pipe or OUT.csv (default: .pipe on stdout)")
    add_force_argument(parser, "an existing OUT")
    parser.add_argument("--semantics", choices=(Semantics.RENDEZVOUS.value, Semantics.BUFFERED.value),
                        help="what the result is verified under (default: rendezvous, buffered with --defer-recv); "
                             "buffered suits a torch compute_comms CSV, whose cells torch posts one by one")
    parser.add_argument("--json", action="store_true",
                        help="with -o: print one JSON object saying what was written")
    parser.set_defaults(handler=run)


def add_pass_arguments(parser: argparse.ArgumentParser) -> None:
    """The optional passes, shared by lower, codegen and run."""
    group = parser.add_argument_group("passes")
    group.add_argument("--unshard", type=int, metavar="K",
                       help="UNSHARD each stage's parameters before use and RESHARD after, at most K stages "
                            "gathered per rank (torch's max_active_stages)")
    group.add_argument("--reduce-grad", action="store_true",
                       help="REDUCE_GRAD after each stage's last backward on each rank where it is not written "
                            "(lowering a compute-only schedule inserts it anyway)")
    group.add_argument("--merge-bw", action="store_true", help="an I directly followed by its W becomes one B")
    group.add_argument("--defer-recv", action="store_true",
                       help="post each receive just before the compute that needs it (torch's defer_pp_recv); "
                            "the result is verified under buffered semantics, which the runtime follows")
    group.add_argument("--verify-each", action="store_true",
                       help="verify the schedule before the passes and after each of them, and name the pass "
                            "after which it no longer verifies")


def pass_options(args: argparse.Namespace):
    from pipeforge.passes.pipeline import PassOptions

    if args.unshard is not None and args.unshard < 1:
        raise UsageError(f"--unshard {args.unshard}: expected at least 1 (stages gathered at once on a rank)")
    return PassOptions(unshard=args.unshard, reduce_grad=args.reduce_grad, merge_bw=args.merge_bw,
                       defer_recv=args.defer_recv)


def load_with_passes(args: argparse.Namespace):
    """The schedule PATH names through the passes the flags ask for (not lowered here: codegen and
    run lower and verify it, under ``semantics_for`` the options)."""
    return through_passes(args, load_input(args), pass_options(args), lower=False,
                          semantics=semantics_for(pass_options(args)))


def through_passes(args: argparse.Namespace, schedule, options, *, lower: bool, semantics: Semantics):
    """``schedule`` through the passes ``options`` names; with ``--verify-each``, verified under ``semantics``
    before them and after each (a VerificationError names the pass after which it no longer verifies)."""
    from pipeforge.passes.pipeline import apply_passes

    callback = None
    if args.verify_each:
        callback = verifying_each(schedule, semantics)
    return apply_passes(schedule, options, lower=lower, callback=callback)


def verifying_each(schedule, semantics: Semantics):
    """The callback of ``--verify-each``: ``schedule`` (the input) is verified now, each pass's result
    when the pass has run."""
    from pipeforge.verifier import verify

    report = verify(schedule, semantics=semantics)
    if not report.valid:
        raise VerificationError(f"--verify-each: schedule {schedule.name!r} does not verify under {semantics} "
                                f"before any pass:\n{report.render()}", report=report)

    def check(schedule_pass, result) -> None:
        after = verify(result, semantics=semantics)
        if not after.valid:
            raise VerificationError(f"--verify-each: pass {schedule_pass.name!r} broke schedule {schedule.name!r}: "
                                    f"it verifies under {semantics} before the pass, not after it; nothing "
                                    f"written:\n{after.render()}", report=after)

    return check


def pass_flags(args: argparse.Namespace) -> list[str]:
    """The pass options as command-line flags again (for the torchrun line ``run`` prints)."""
    flags = [] if args.unshard is None else ["--unshard", str(args.unshard)]
    names = (("reduce_grad", "--reduce-grad"), ("merge_bw", "--merge-bw"), ("defer_recv", "--defer-recv"),
             ("verify_each", "--verify-each"))
    return flags + [flag for name, flag in names if getattr(args, name)]


def semantics_for(options) -> Semantics:
    """The semantics a schedule through these passes is verified under."""
    return Semantics.BUFFERED if options.defer_recv else Semantics.RENDEZVOUS


def run(args: argparse.Namespace) -> int:
    from pipeforge.verifier import verify

    suffix = Path(args.output).suffix if args.output else ".pipe"
    if suffix not in SUFFIXES:
        raise UsageError(f"-o {args.output!r}: the output {suffix_problem('.pipe or .csv', suffix)}")
    if args.json and not args.output:
        raise UsageError("--json needs -o OUT (without it the .pipe source is what stdout holds)")
    options = pass_options(args)
    semantics = Semantics(args.semantics) if args.semantics else semantics_for(options)
    schedule = through_passes(args, load_input(args), options, lower=True, semantics=semantics)
    report = verify(schedule, semantics=semantics)
    if not report.valid:
        raise VerificationError(f"the lowered schedule {schedule.name!r} does not verify; nothing written:\n"
                                f"{report.render()}")
    text = render(schedule, suffix)
    if not args.output:
        sys.stdout.write(text)
        return Exit.OK
    if suffix == ".pipe":
        write_source(args.output, text, args.force)
    else:
        from pipeforge.files import write_output

        write_output(args.output, text, force=args.force)
    if args.json:
        print_json({"schedule": schedule.name, "output": args.output, "ranks": schedule.ranks,
                    "actions": schedule.action_count()})
    return Exit.OK


def render(schedule, suffix: str) -> str:
    if suffix == ".csv":
        from pipeforge.interop.torch_csv import to_csv_text

        return to_csv_text(schedule, "compute_comms")
    from pipeforge.lang.printer import print_schedule

    return print_schedule(schedule)
