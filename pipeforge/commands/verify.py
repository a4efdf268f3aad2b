"""``pipeforge verify``: prove a schedule deadlock-free and complete, or show why it is not."""

from __future__ import annotations

import argparse
import sys

from pipeforge.commands import wording
from pipeforge.commands.common import add_input_arguments, load_input, print_json
from pipeforge.commands.exits import Exit
from pipeforge.errors import PipeSyntaxError, SemanticError, printable


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "verify", help="check a schedule with the z3 model",
        description="Check ordering, matching, deadlock freedom, completeness, placement and memory. "
                    "A compute-only schedule is checked as 'lower' makes it; written communication as written.")
    add_input_arguments(parser)
    parser.add_argument("--semantics", choices=("rendezvous", "buffered", "nccl"), default="rendezvous",
                        help="rendezvous (default: zero-buffer, conservative), buffered sends, or nccl "
                             "(each op of a group completes once its partner is posted; docs/semantics.md)")
    solve = parser.add_mutually_exclusive_group()
    solve.add_argument("--solve", dest="solve", action="store_true", default=None,
                       help="z3 decides the timing model with free start times (default up to "
                            "a few thousand group steps)")
    solve.add_argument("--no-solve", dest="solve", action="store_false",
                       help="z3 only checks the event pass's timing (the certificate)")
    parser.add_argument("--memory-limit", type=float, metavar="X",
                        help="activation memory limit per rank in M_B (overrides the schedule's)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from pipeforge._gc import gc_paused

    with gc_paused():  # reading a large CSV builds ~10^5 acyclic values: collections would cost more
        return check(args)


def check(args: argparse.Namespace) -> int:
    from pipeforge.verifier import verify

    try:
        schedule = load_input(args)
    except (PipeSyntaxError, SemanticError) as error:  # the text is not a well-formed schedule
        if not args.json:
            raise
        print_json(syntax_report(error))
        return Exit.USAGE
    if args.memory_limit is not None:
        from pipeforge.sim.costs import memory_for

        memory_for(schedule, args.memory_limit)  # refuses a limit that is not a positive number
    report = verify(schedule, semantics=args.semantics, memory_limit=args.memory_limit, solve=args.solve)
    if args.json:
        print_json(report.to_json())
    else:
        print(printable(report.render(), keep="\n"), file=sys.stdout)
        hint = csv_deadlock_hint(args, schedule, report)
        if hint:
            print(hint, file=sys.stdout)
    return Exit.OK if report.valid else Exit.INVALID


def csv_deadlock_hint(args: argparse.Namespace, schedule, report) -> str | None:
    """A torch CSV has no groups: each cell is its own batch, which rendezvous may find deadlocked."""
    from pipeforge.verifier import verify

    if not str(args.path).endswith(".csv") or args.semantics != "rendezvous" or report.kinds() != {"deadlock"}:
        return None
    if not verify(schedule, semantics="buffered", memory_limit=args.memory_limit, certify=False).valid:
        return None
    return ("note: valid under --semantics buffered. A torch CSV has no group notation, so each cell is "
            "read as its own group; torch's runtime posts each cell as its own batch and waits only at the "
            "compute that needs a receive, which buffered semantics models.")


def syntax_report(error: PipeSyntaxError | SemanticError) -> dict:
    """The JSON an error in the text gets (a syntax error, or one found elaborating it, such as a
    microbatch out of range or a failed ``require``): not valid, one ``syntax`` violation, no statistics."""
    violation = {"kind": "syntax", "message": wording.message(error), "rank": None, "step": None,
                 "location": error.location}
    stats = {"ranks": None, "stages": None, "microbatches": None, "actions": None, "seconds": 0.0}
    return {"valid": False, "violations": [violation], "stats": stats}
