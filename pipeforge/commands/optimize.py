"""``pipeforge optimize``: a better compute order, verified, written as plain .pipe text."""

from __future__ import annotations

import argparse
import sys
import time

from pipeforge.commands.common import JoinItems, add_force_argument, add_input_arguments, load_input, print_json
from pipeforge.commands.common import require_suffix, write_source
from pipeforge.commands.exits import Exit
from pipeforge.commands.simulate import COST_HELP, add_cost_file_argument
from pipeforge.errors import PipeforgeError, UsageError, printable
from pipeforge.semantics import within_limit

MIN_SEARCH_S = 1e-3  # what optimize gets when reading the input took the whole limit


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "optimize", help="reorder a schedule's compute to cut bubbles",
        description="Search for a compute order with a smaller bubble rate under a cost model and a "
                    "memory limit; verify it and write it as a plain .pipe file.")
    add_input_arguments(parser, placement_flag="--input-placement")
    parser.add_argument("--cost", action=JoinItems, metavar="F=1,I=1,W=1,comm=0", help=COST_HELP)
    add_cost_file_argument(parser)
    parser.add_argument("--memory-limit", type=float, metavar="X",
                        help="activation memory limit per rank, in M_B (one microbatch on one stage); "
                             "default: the schedule's own limit, else the input's peak")
    parser.add_argument("--strategy", choices=("auto", "greedy", "local", "exact"), default="auto",
                        help="auto (default): greedy, then local search, then exact search when small")
    parser.add_argument("--placement", choices=("keep", "loop", "v", "interleaved", "any"), default="keep",
                        help="keep (default): the input's placement; loop: one stage a rank; v: two chunks a rank "
                             "in a V; interleaved: two chunks a rank in loop order; any: the best of these. "
                             "Splitting a stage in k chunks divides its compute and memory by k")
    parser.add_argument("--time-limit", type=float, default=10.0, metavar="S",
                        help="seconds for the whole command: reading, search, verification and writing "
                             "(default 10); the first greedy orders are built whatever the limit")
    parser.add_argument("--recompute", choices=("none", "auto", "all"), default=None,
                        help="none: no recompute; all: every (stage, microbatch) recomputed (an R before each "
                             "first backward); auto: the better of the two within the memory limit. Default: "
                             "none, and auto when the limit cannot be met otherwise")
    parser.add_argument("--offload", action="store_true",
                        help="also try every activation offloaded to host memory (OFFLOAD after each F, RELOAD "
                             "before each first backward, on the copy lane)")
    parser.add_argument("-o", "--output", required=True, metavar="OUT.pipe", help="where to write the result")
    add_force_argument(parser, "an existing OUT.pipe")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.set_defaults(handler=run)


class ProgressLine:
    """Progress on stderr once a search has run for a second: a bar on a terminal, else plain lines."""

    def __init__(self, stream=None, delay: float = 1.0):
        self.stream = stream or sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.started, self.delay = time.monotonic(), delay
        self.last_text, self.last_time, self.drawn = "", 0.0, False

    def __call__(self, fraction: float, message: str) -> None:
        now = time.monotonic()
        if now - self.started < self.delay:
            return
        if self.tty:
            filled = int(30 * min(max(fraction, 0.0), 1.0))
            self.stream.write(f"\r[{'#' * filled}{'.' * (30 - filled)}] {message[:60]:<60}")
            self.stream.flush()
            self.drawn = True
        elif message != self.last_text and now - self.last_time >= 1.0:
            self.stream.write(f"optimize: {now - self.started:.1f} s: {message}\n")
            self.last_text, self.last_time = message, now

    def close(self) -> None:
        if self.drawn:
            self.stream.write("\n")


def run(args: argparse.Namespace) -> int:
    began = time.monotonic()
    from pipeforge.lang.printer import print_schedule
    from pipeforge.optimizer import optimize
    from pipeforge.sim.costfile import with_cost_file
    from pipeforge.sim.costs import costs_for, memory_for

    require_suffix(args.output, ".pipe")
    if not 0 < args.time_limit < float("inf"):
        raise UsageError(f"--time-limit {args.time_limit!r}: expected a positive number of seconds")
    schedule = with_cost_file(load_input(args), args.cost_file)
    costs = costs_for(schedule, args.cost)
    memory = memory_for(schedule, args.memory_limit, args.cost)
    progress = ProgressLine()
    choice = None
    try:
        saving = any(a.kind.value in ("R", "OFFLOAD", "RELOAD") for _, _, a in schedule.actions())
        if args.recompute is None and not args.offload and not saving:
            try:
                result = optimize(schedule, costs=costs, memory_limit=memory.limit, strategy=args.strategy,
                                  time_limit=_time_left(args.time_limit, began), progress=progress,
                                  weights=memory.weights, placement=args.placement)
            except PipeforgeError as error:
                if memory.limit is None:
                    raise
                try:  # auto when the limit cannot be met otherwise; where that fails too, the first error stands
                    result, choice = _with_memory_actions(schedule, "auto", args, costs, memory, began, progress)
                except PipeforgeError:
                    raise error from None
        else:
            # an input that recomputes or offloads already: auto unless told (its R, OFFLOAD, RELOAD are redone)
            result, choice = _with_memory_actions(schedule, args.recompute or ("auto" if saving else "none"), args,
                                                  costs, memory, began, progress)
    finally:
        progress.close()
    write_source(args.output, print_schedule(result.schedule), args.force)
    if args.json:
        extra = {} if choice is None else {"memory_actions": choice.to_json()}
        print_json({**result.to_json(), **extra, "output": args.output})
        return Exit.OK
    if choice is not None:
        print(f"recompute {choice.recompute}: {choice.recomputed} (stage, microbatch) recomputed, "
              f"{choice.offloaded} offloaded (tried: {', '.join(choice.tried)})")
    print(report(result, args.output))
    return Exit.OK


def _with_memory_actions(schedule, policy: str, args, costs, memory, began: float, progress):
    """``optimize_memory``: the order and the recompute/offload choice (``optimizer/memory_actions.py``)."""
    from pipeforge.optimizer.memory_actions import optimize_memory

    if args.placement != "keep":
        raise UsageError("--recompute and --offload keep the input's placement: drop --placement")
    return optimize_memory(schedule, recompute=policy, offload=args.offload, costs=costs,
                           memory_limit=memory.limit, strategy=args.strategy,
                           time_limit=_time_left(args.time_limit, began), progress=progress, weights=memory.weights)


def _time_left(time_limit: float, began: float) -> float:
    """What is left of ``--time-limit`` once the input is read: it bounds the whole command from the
    moment it starts (the search leaves the verification and the writing their time; the
    interpreter's own start-up, about 0.1 s, comes before)."""
    return max(time_limit - (time.monotonic() - began), MIN_SEARCH_S)


def report(result, output: str) -> str:
    """The human report: before, after and the bound side by side. The bound bounds the worst span
    (the step time), so spans come first; bubble rates count one work for all three columns (the least
    work, ``result.LEAST_WORK``), and simulate's own rates follow where they differ."""
    from pipeforge.optimizer.result import STOP_REASONS
    from pipeforge.sim.bounds import WORK_SPACE

    before, after, schedule, limit = result.before, result.after, result.schedule, result.memory_limit
    verdict = "optimal" if result.optimal else f"gap {100 * result.gap:.2f}% of the span"
    lines = [
        f"optimize {schedule.name}: {schedule.ranks} ranks, {schedule.stages} stages, "
        f"{schedule.microbatches} microbatches; strategy {result.strategy}, best from {result.found_by}, "
        f"{result.seconds:.2f} s",
        f"{'':13}{'before':>10}{'after':>10}{'bound':>10}",
        f"{'worst span':13}{before.max_span:>10.4g}{after.max_span:>10.4g}{result.span_bound:>10.4g}  {verdict}",
        f"{'bubble rate':13}{_pct(before.least_work_bubble_rate):>10}{_pct(after.least_work_bubble_rate):>10}"
        f"{_pct(result.bound):>10}  of the least work (F and the cheaper of B or I + W)",
        *_own_rates(before, after),
        f"{'makespan':13}{before.makespan:>10.4g}{after.makespan:>10.4g}",
        f"peak memory  before {_peaks(before.peak_memory)}; after {_peaks(after.peak_memory)}"
        + (f" (limit {limit:g})" if limit is not None else " (no limit)"),
        f"placement: {result.placement}" + ("" if len(result.placements_tried) == 1
                                            else f" (tried: {'; '.join(result.placements_tried)})"),
        f"bound: {result.bound_of}"
        + (f"; before any search {_pct(result.work_bound.bubble_rate)} (what simulate reports as its bound "
           f"on {WORK_SPACE}{_binding(result.work_bound)})" if result.work_bound is not None else ""),
        *_fuse_line(result),
        f"stopped: {STOP_REASONS[result.stopped]}",
        f"wrote {printable(output)}" + ("" if result.improved else " (the input: nothing better found)"),
    ]
    if not within_limit(max(before.peak_memory, default=0.0), limit):
        lines.insert(-1, f"note: the input holds {max(before.peak_memory):g} M_B, over the limit {limit:g}; "
                         "the result fits the limit, which can cost time")
    return "\n".join(lines)


def _fuse_line(result) -> list[str]:
    """Which pass kept B whole or split it, where some stage's B costs less than its I + W."""
    from pipeforge.optimizer.result import FUSE_PASSES

    if result.fuse is None:
        return []
    split = "" if result.split_bound is None else f" (split_bound {result.split_bound:.4g})"
    return [f"fuse: {FUSE_PASSES[result.fuse]}{split}"]


def _own_rates(before, after) -> list[str]:
    """simulate's bubble rates (each schedule's own compute) where they differ from the least work's."""
    if all(abs(m.bubble_rate - m.least_work_bubble_rate) < 5e-5 for m in (before, after)):
        return []
    return [f"{'  (simulate)':13}{_pct(before.bubble_rate):>10}{_pct(after.bubble_rate):>10}"
            f"{'':10}  of each schedule's own compute (I + W where B is split)"]


def _binding(bound) -> str:
    """Which rank's bound is the bound, and by which argument (``sim.bounds.ARGUMENTS``)."""
    return f"; {bound.binding_text}" if bound.binding_text else ""


def _pct(value: float) -> str:
    return f"{100 * value:.2f}%"


def _peaks(peaks: tuple[float, ...]) -> str:
    return " ".join(f"{p:g}" for p in peaks)
