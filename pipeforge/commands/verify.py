"""``pipeforge verify``: prove a schedule deadlock-free and complete, or show why it is not."""

from __future__ import annotations

import argparse
import sys

from pipeforge.commands import wording
from pipeforge.commands.common import add_input_arguments, load_input, print_json
from pipeforge.commands.exits import Exit
from pipeforge.errors import PipeSyntaxError, SemanticError, printable
from pipeforge.semantics import Semantics


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "verify", help="check a schedule with the z3 model",
        description="Check ordering, matching, deadlock freedom, completeness, placement and memory. "
                    "A compute-only schedule is checked as 'lower' makes it; written communication as written.")
    add_input_arguments(parser)
    parser.add_argument("--semantics", choices=tuple(s.value for s in Semantics), default=Semantics.RENDEZVOUS.value,
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
    parser.add_argument("--as", dest="target", choices=("torch", "torchtitan"),
                        help="check the program torch's _PipelineScheduleRuntime runs for this schedule (its own "
                             "lowering, under its runtime's semantics); torchtitan: also the stages its launcher "
                             "builds on each rank (docs/torch.md)")
    parser.add_argument("--defer-pp-recv", action="store_true",
                        help="with --as: torch's defer_pp_recv=True (receives moved next to their consumers)")
    parser.add_argument("--pp-schedule", metavar="NAME", default="1F1B",
                        help="with --as torchtitan: its pipeline_parallel_schedule (default 1F1B, torchtitan's)")
    parser.add_argument("--layers", type=int, metavar="N", help="with --as torchtitan: the model's layer count")
    parser.add_argument("--layers-per-stage", type=int, metavar="N",
                        help="with --as torchtitan: its pipeline_parallel_layers_per_stage")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
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
    if args.target is not None:
        return check_as(args, schedule)
    report = verify(schedule, semantics=args.semantics, memory_limit=args.memory_limit, solve=args.solve)
    if args.json:
        print_json(report.to_json())
    else:
        print(printable(report.render(), keep="\n"), file=sys.stdout)
        hint = csv_deadlock_hint(args, schedule, report)
        if hint:
            print(hint, file=sys.stdout)
    return Exit.OK if report.valid else Exit.INVALID


def check_as(args: argparse.Namespace, schedule) -> int:
    """``--as torch|torchtitan``: the verdict on the program torch runs (and the stages torchtitan builds)."""
    from pipeforge.errors import UsageError
    from pipeforge.interop.torch_target import verify_as
    from pipeforge.interop.torchtitan import Launcher, check_name

    if schedule.chains > 1:
        raise UsageError(f"--as {args.target}: {schedule.name!r} is bidirectional ({schedule.chains} chains); torch's "
                         "runtime runs one chain")
    launcher = Launcher(check_name(args.pp_schedule), args.layers, args.layers_per_stage)
    verdict = verify_as(schedule, args.target, defer_pp_recv=args.defer_pp_recv, launcher=launcher)
    if args.json:
        print_json(verdict.to_json())
    else:
        print(verdict.render(), file=sys.stdout)
    return Exit.OK if verdict.valid else Exit.INVALID


def csv_deadlock_hint(args: argparse.Namespace, schedule, report) -> str | None:
    """A torch CSV has no groups: each cell is its own batch, which rendezvous may find deadlocked."""
    from pipeforge.verifier import verify

    if not str(args.path).endswith(".csv") or args.semantics != Semantics.RENDEZVOUS or report.kinds() != {"deadlock"}:
        return None
    if not verify(schedule, semantics=Semantics.BUFFERED, memory_limit=args.memory_limit, certify=False).valid:
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
