"""The fuse search (``optimizer/fuse.py``) against the same optimize without it, in one run.

The costs are a cost file (``--costs``, ``sim/costfile.py``) written by this
script for each number of stages, shaped like what ``pipeforge profile``
measured on the GPT with a heavy embedding and LM head (``docs/profile.md``):
the first stage's I is almost nothing and its B costs more than I + W, the last
stage is heavy with B < I + W, one middle stage has B > I + W and the others B
about 0.86 of I + W; links of 0.5 ms. The input is 1F1B, the memory limit its
own peak (``pipeforge optimize 1f1b -D P=8 -D M=32 --costs FILE``). Three parts:

1. ``descents``: fuse descents alone (no local search) from 1F1B and its least
   work, to the end: ``moves`` counts the candidates judged, ``descent s`` the
   seconds in them, so ``moves/s`` is the cost of a move (no reference: a
   number to compare across commits, in one run on each tree);
2. ``auto``: ``optimize`` (strategy auto, the default time limit of 10 s)
   without the fuse pass (the split work only) and with it: the worst span and
   the bubble each reaches within the limit, beside the proven bound;
3. ``greedy`` and ``exact``: the explicit strategies without the fuse pass and
   with it.

    python -m benchmarks.optimize.fuse [--time-limit S] [--parts descents,auto,strategies]

Exits 1 when a result with the fuse pass is worse than the one without it, or
takes more than a second beyond the time limit.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import tempfile
import time

import pipeforge
from pipeforge.optimizer import fuse, optimize
from pipeforge.optimizer.evaluate import Graph, Problem, compute_actions
from pipeforge.optimizer.search import split_actions
from pipeforge.optimizer.units import integer_units
from pipeforge.sim.costfile import with_cost_file

DESCENTS = ((4, 16), (8, 16))
AUTO = ((4, 16), (8, 16), (8, 32))
STRATEGIES = (("greedy", 8, 32), ("exact", 4, 8))
PARTS = ("descents", "auto", "strategies")


def cost_file(stages: int, folder: str) -> str:
    """The benchmark's cost file for ``stages`` stages (ms; see the module doc)."""
    rows = []
    for s in range(stages):
        if s == 0:
            rows.append({"F": 9.0, "I": 0.2, "W": 17.0, "B": 17.6})
        elif s == stages - 1:
            rows.append({"F": 14.0, "I": 13.5, "W": 14.5, "B": 24.0})
        elif s == stages // 2:
            rows.append({"F": 9.2, "I": 9.0, "W": 9.1, "B": 18.6})
        else:
            rows.append({"F": round(9.0 + 0.1 * s, 2), "I": 9.1, "W": 9.3, "B": round(15.9 + 0.1 * s, 2)})
    path = os.path.join(folder, f"costs-{stages}.json")
    with open(path, "w") as out:
        json.dump({"units": "ms", "stages": rows, "links": [0.5] * (stages - 1)}, out, indent=1)
    return path


def schedule_of(p: int, m: int, folder: str):
    return with_cost_file(pipeforge.load("1f1b", defines={"P": p, "M": m}), cost_file(p, folder))


@contextlib.contextmanager
def counted(cls):
    """Count ``cls``'s judged candidates inside its descents and time the descents."""
    tally = {"moves": 0, "seconds": 0.0, "inside": False}
    judge, descend = cls.judge, cls.descend

    def counting_judge(self, *args):
        tally["moves"] += tally["inside"]
        return judge(self, *args)

    def timed_descend(self, *args):
        started, tally["inside"] = time.perf_counter(), True
        try:
            return descend(self, *args)
        finally:
            tally["seconds"] += time.perf_counter() - started
            tally["inside"] = False

    cls.judge, cls.descend = counting_judge, timed_descend
    try:
        yield tally
    finally:
        cls.judge, cls.descend = judge, descend


@contextlib.contextmanager
def fuse_search_as(replacement):
    """``optimize`` with ``replacement`` as its fuse search (``search.py`` imports it when it runs)."""
    current = fuse.FuseSearch
    fuse.FuseSearch = replacement
    try:
        yield
    finally:
        fuse.FuseSearch = current


class NoFusePass:
    """No fuse pass: the strategies order the split work only."""

    def __init__(self, *args):
        pass

    def run(self, seeds, local=True):
        return None


def rate(tally) -> float:
    return tally["moves"] / tally["seconds"] if tally["seconds"] > 0 else 0.0


def ratio(ours: float | None, theirs: float | None) -> str:
    return "" if ours is None or not theirs else f"{ours / theirs:.2f}"


# -- 1. descents alone, to the end ------------------------------------------------------------------------


def descent_problem(p: int, m: int, folder: str):
    """1F1B in integer units (as optimize times it), its split graph, and the input as a seed."""
    schedule = schedule_of(p, m, folder)
    limit = max(pipeforge.simulate(schedule).peak_memory)  # optimize's default: the input's own peak
    problem = Problem.of(schedule, integer_units(schedule.costs).costs, limit)
    compute = schedule.compute_only()
    graph = Graph(problem, compute_actions(compute))
    return problem, Graph(problem, split_actions(compute_actions(compute))), (graph, graph.order_of(compute))


def this_descents(split, seed, deadline):
    search = fuse.FuseSearch(split, deadline, 0.0)
    return min(search.descend(start)[0].evaluation.key() for start in search.starts([seed]))


def descents(folder: str) -> bool:
    print("1. fuse descents alone from 1F1B and its least work, to the end")
    print(f"{'P':>3} {'M':>3} {'moves':>7} {'descent s':>10} {'moves/s':>9} {'worst span':>11}")
    for p, m in DESCENTS:
        _, split, seed = descent_problem(p, m, folder)
        with counted(fuse.FuseSearch) as tally:
            key = this_descents(split, seed, time.monotonic() + 600)
        print(f"{p:>3} {m:>3} {tally['moves']:>7} {tally['seconds']:>10.2f} {rate(tally):>9.0f} {key[0]:>11.6g}")
    print("(worst span in integer units)")
    return True


# -- 2. optimize auto at its default limit -----------------------------------------------------------------


def auto(folder: str, time_limit: float) -> bool:
    print(f"\n2. optimize 1f1b --costs FILE (auto, --time-limit {time_limit:g}): without the fuse pass and with it")
    print(f"{'P':>3} {'M':>3} {'side':>9} {'worst span':>11} {'bubble':>7} {'bound':>7} {'found by':>9} {'s':>6}"
          f" {'span ratio':>10}")
    ok = True
    for p, m in AUTO:
        schedule = schedule_of(p, m, folder)
        rows = {}
        for side, replacement in (("no fuse", NoFusePass), ("fuse", fuse.FuseSearch)):
            with fuse_search_as(replacement):
                rows[side] = optimize(schedule, time_limit=time_limit)
        for side, result in rows.items():
            extra = ratio(result.after.max_span, rows["no fuse"].after.max_span) if side == "fuse" else ""
            print(f"{p:>3} {m:>3} {side:>9} {result.after.max_span:>11.5g} {result.after.least_work_bubble_rate:>7.4f}"
                  f" {result.bound:>7.4f} {result.found_by:>9} {result.seconds:>6.2f} {extra:>10}")
        ok &= rows["fuse"].after.max_span <= rows["no fuse"].after.max_span + 1e-9
        ok &= rows["fuse"].seconds <= time_limit + 1.0
    print("(worst span in ms; bubble of the least work; span ratio = with the fuse pass / without)")
    return ok


# -- 3. explicit greedy and exact ---------------------------------------------------------------------------


def strategies(folder: str, time_limit: float) -> bool:
    print(f"\n3. explicit strategies (--time-limit {time_limit:g}): without the fuse pass and with it")
    print(f"{'strategy':>8} {'P':>3} {'M':>3} {'side':>9} {'worst span':>11} {'bubble':>7} {'found by':>9} {'s':>6}"
          f" {'span ratio':>10}")
    ok = True
    for strategy, p, m in STRATEGIES:
        schedule = schedule_of(p, m, folder)
        rows = {}
        for side, replacement in (("no fuse", NoFusePass), ("fuse", fuse.FuseSearch)):
            with fuse_search_as(replacement):
                rows[side] = optimize(schedule, strategy=strategy, time_limit=time_limit)
        for side, result in rows.items():
            extra = ratio(result.after.max_span, rows["no fuse"].after.max_span) if side == "fuse" else ""
            print(f"{strategy:>8} {p:>3} {m:>3} {side:>9} {result.after.max_span:>11.5g}"
                  f" {result.after.least_work_bubble_rate:>7.4f} {result.found_by:>9} {result.seconds:>6.2f}"
                  f" {extra:>10}")
        ok &= rows["fuse"].after.max_span <= rows["no fuse"].after.max_span + 1e-9
        ok &= rows["fuse"].seconds <= time_limit + 1.0
    print("(span ratio = with the fuse pass / without)")
    return ok


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--time-limit", type=float, default=10.0, help="seconds per optimize call (default 10)")
    parser.add_argument("--parts", default=",".join(PARTS), help=f"which parts to run (default {','.join(PARTS)})")
    args = parser.parse_args()
    parts = args.parts.split(",")
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}\n")
    ok = True
    with tempfile.TemporaryDirectory() as folder:
        if "descents" in parts:
            ok &= descents(folder)
        if "auto" in parts:
            ok &= auto(folder, args.time_limit)
        if "strategies" in parts:
            ok &= strategies(folder, args.time_limit)
    print(f"\nload average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print("all checks passed" if ok else "SOME CHECK FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
