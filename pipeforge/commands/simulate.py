"""``pipeforge simulate``: makespan, bubble rate, bounds and memory of a schedule on a cost model."""

from __future__ import annotations

import argparse

from pipeforge.commands.common import JoinItems, add_input_arguments, check_width, load_input, print_json
from pipeforge.commands.exits import Exit

COST_HELP = ("override costs field by field: F=1,I=1,W=1,B=2,comm=0 (B defaults to I+W); "
             "weights=X sets M_W/M_B, what an I holds until its W (>= 0; above 1 the I adds the excess); "
             "repeatable, each item named once")


def register(subparsers) -> None:
    parser = subparsers.add_parser("simulate", help="simulate a schedule on a cost model",
                                   description="Run the compute order on a cost model and report the "
                                               "makespan, bubble rate, lower bounds and peak memory.")
    add_input_arguments(parser)
    add_cost_arguments(parser)
    parser.add_argument("--width", type=int, default=100,
                        help="columns of the text grid, 0 to 10000 (default 100, as 0)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.set_defaults(handler=run)


def add_cost_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--cost", action=JoinItems, metavar="F=1,I=1,W=1,comm=0", help=COST_HELP)
    add_cost_file_argument(parser)
    parser.add_argument("--memory-limit", type=float, metavar="X",
                        help="activation memory limit per rank, in M_B (one microbatch on one stage)")


def add_cost_file_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--costs", metavar="FILE", dest="cost_file",
                        help="per-stage costs from a JSON cost file (as `pipeforge profile` writes; "
                             "docs/language.md, Cost files); --cost items apply on top")


def simulate_input(args: argparse.Namespace):
    """Load what the arguments name and simulate it with their cost and memory overrides."""
    from pipeforge.sim import simulate
    from pipeforge.sim.costs import costs_for, memory_for

    from pipeforge.sim.costfile import with_cost_file

    schedule = with_cost_file(load_input(args), getattr(args, "cost_file", None))
    costs = costs_for(schedule, args.cost)
    memory = memory_for(schedule, getattr(args, "memory_limit", None), args.cost)
    return simulate(schedule, costs, memory=memory)


def run(args: argparse.Namespace) -> int:
    from pipeforge.render.grid import render_text

    check_width(args.width)  # as show's: -1 refused (it was clamped silently), 0 the default
    timeline = simulate_input(args)
    if args.json:
        print_json(timeline.to_json())
        return Exit.OK
    print(summary(timeline))
    print()
    print(render_text(timeline, width=args.width or 100), end="")
    return Exit.OK


def _cost_text(costs, stages: int) -> str:
    """``F=1 I=1 W=1 B=2 comm=0``, or per stage ``F=[3 1 1 3] ...`` when the stages differ."""
    from pipeforge.ir import ActionKind

    def values(kind: str) -> list[float]:
        return [costs.duration(ActionKind(kind), s) for s in range(stages)]

    kinds = {kind: values(kind) for kind in ("F", "I", "W", "B")}
    if all(len(set(v)) <= 1 for v in kinds.values()) and not costs.links:
        return " ".join([f"{k}={v[0]:g}" for k, v in kinds.items() if v] + [f"comm={costs.comm:g}"])
    text = " ".join(f"{k}=[{' '.join(f'{x:.4g}' for x in v)}]" for k, v in kinds.items())
    links = [costs.latency(s, s + 1) for s in range(stages - 1)]
    return f"per stage {text} links=[{' '.join(f'{x:.4g}' for x in links)}]"


def summary(timeline) -> str:
    """The human report: figures of merit beside their bounds."""
    from pipeforge.sim.bounds import ORDERS_SPACE, WORK_SPACE

    cost_text = _cost_text(timeline.costs, timeline.stages)
    bounds, work = timeline.bounds, timeline.work_bound
    lines = [
        f"schedule {timeline.name}: {timeline.ranks} ranks, {timeline.stages} stages, "
        f"{timeline.microbatches} microbatches; costs {cost_text}",
        f"makespan     {timeline.makespan:<10g} lower bound {timeline.lower_bound:g} ({bounds.binding}); "
        f"gap {100 * timeline.gap:.2f}%  [{ORDERS_SPACE}]",
        f"bubble rate  {f'{100 * timeline.bubble_rate:.2f}%':<10} "
        f"lower bound {100 * timeline.bubble_lower_bound:.2f}%; "
        f"gap {100 * (timeline.bubble_rate - timeline.bubble_lower_bound):.2f} points  [{ORDERS_SPACE}]",
        f"{'':13}{'':<10} lower bound {100 * work.bubble_rate:.2f}%; "
        f"gap {100 * (timeline.work_bubble_rate - work.bubble_rate):.2f} points  [{WORK_SPACE}, "
        f"{_work_limit_text(timeline)}"
        + (f"; {work.binding_text}" if work.binding_text else "")
        + _own_work_rate(timeline) + "]",
        "peak memory  " + "  ".join(f"r{r}: {peak:g}" for r, peak in enumerate(timeline.peak_memory))
        + _limit_text(timeline),
    ]
    if timeline.costs.overhead.given:
        lines.append(f"step time    {timeline.step_time:<10g} the makespan and "
                     f"{timeline.step_time - timeline.makespan:g} "
                     "a step costs beyond its actions (the cost file's step and chain_sum)")
    return "\n".join(lines)


def _own_work_rate(timeline) -> str:
    """Nothing where the schedule's bubble rate already counts the bound's work, else the rate that does
    (the gap is taken from it: a fused B cheaper than I + W makes the schedule's own rate incomparable)."""
    if abs(timeline.work_bubble_rate - timeline.bubble_rate) < 5e-5:
        return ""
    return f"; this schedule on that work: {100 * timeline.work_bubble_rate:.2f}%"


def _work_limit_text(timeline) -> str:
    if timeline.work_limit is None and timeline.recomputes_only and timeline.memory.limit is not None and \
            timeline.within_memory_limit is not False:
        return f"at most {timeline.memory.limit:g} M_B a rank, any (stage, microbatch) recomputed or not"
    if timeline.work_limit is None:
        return "any memory (this schedule recomputes or offloads)"
    own = " (this schedule's peak)" if timeline.memory.limit is None else ""
    return f"at most {timeline.work_limit:g} M_B a rank{own}"


def _limit_text(timeline) -> str:
    limit = timeline.memory.limit
    if limit is None:
        return f"  (M_B; weights {timeline.memory.weights:g}, no limit)"
    verdict = "within" if timeline.within_memory_limit else "OVER"
    return f"  (M_B; limit {limit:g}: {verdict})"
