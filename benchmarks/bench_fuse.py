"""The fuse search (``optimizer/fuse.py``) beside its previous version (a graph compiled per move), in one run.

The costs are a cost file (``--costs``, ``sim/costfile.py``) written by this
script for each number of stages, shaped like what ``pipeforge profile``
measured on the GPT with a heavy embedding and LM head (``docs/profile.md``):
the first stage's I is almost nothing and its B costs more than I + W, the last
stage is heavy with B < I + W, one middle stage has B > I + W and the others B
about 0.86 of I + W; links of 0.5 ms. The input is 1F1B, the memory limit its
own peak (``pipeforge optimize 1f1b -D P=8 -D M=32 --costs FILE``).

The previous version is ``fuse.py`` as of commit ``PREVIOUS`` (read with ``git
show`` from this repository and run unchanged; without the history its
columns are left empty). Both are instrumented alike: ``moves`` counts the
candidates judged inside fuse descents, ``descent s`` the seconds spent in
them (local search between descents not included), so ``moves/s`` is the cost
of a move. Three parts:

1. ``descents``: fuse descents alone (no local search) from the same starts
   (1F1B and its least work), to the end: both make the same moves (but for
   the duplicates the previous one judged: "fused at the W" where the W is
   the I's next step), so they must reach the same worst span; the ratio of
   their seconds is the speed-up.
2. ``auto``: ``optimize`` (strategy auto, the default time limit of 10 s) with
   the previous fuse search swapped in, and with this one: moves/s and the
   worst span and bubble reached within the limit.
3. ``greedy`` and ``exact``: explicit strategies, which did not fuse before:
   their result without the fuse pass (as before) and with it.

    PYTHONPATH=. .venv/bin/python benchmarks/bench_fuse.py [--time-limit S] [--parts descents,auto,strategies]

Exits 1 when the descents reach different worst spans, or this version's
result is worse than the previous one's in any row.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import pipeforge  # noqa: E402
from pipeforge.optimizer import fuse, optimize  # noqa: E402
from pipeforge.optimizer.evaluate import Graph, Problem, compute_actions  # noqa: E402
from pipeforge.optimizer.search import split_actions  # noqa: E402
from pipeforge.optimizer.units import integer_units  # noqa: E402
from pipeforge.sim.costfile import with_cost_file  # noqa: E402

PREVIOUS = "f94a6d9"  # the last commit whose fuse search compiled a work graph per move
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


def load_previous():
    """``fuse.py`` as of ``PREVIOUS``, as module ``fuse_previous``, or None without the history."""
    try:
        source = subprocess.run(["git", "-C", str(ROOT), "show", f"{PREVIOUS}:pipeforge/optimizer/fuse.py"],
                                capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    spec = importlib.util.spec_from_loader("fuse_previous", loader=None)
    module = importlib.util.module_from_spec(spec)
    exec(compile(source, f"{PREVIOUS}:pipeforge/optimizer/fuse.py", "exec"), module.__dict__)
    return module


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


def previous_adapter(previous):
    class Previous:
        """The previous search behind today's call (it always ran local search between its descents)."""

        def __init__(self, split, deadline, target, progress=None):
            self.inner = previous.FuseSearch(split.problem, deadline, target, progress)

        def run(self, seeds, local=True):
            return self.inner.run(seeds)

    return Previous


class NoFusePass:
    """No fuse pass: what explicit greedy and exact did before (they ordered the split work only)."""

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


def previous_descents(previous, problem, seed, deadline):
    search = previous.FuseSearch(problem, deadline, 0.0)
    programs = previous.programs_of(*seed)
    least = previous.split_everywhere(previous.fused_everywhere(programs, search.fusable),
                                      search.stages - search.fusable)
    starts = sorted((found for found in map(search.judge, (programs, least)) if found is not None),
                    key=lambda found: found[2].key())
    return min(search.descend(start)[0][2].key() for start in starts)


def this_descents(split, seed, deadline):
    search = fuse.FuseSearch(split, deadline, 0.0)
    return min(search.descend(start)[0].evaluation.key() for start in search.starts([seed]))


def descents(previous, folder: str) -> bool:
    print("1. fuse descents alone from 1F1B and its least work, to the end (the same moves: the same result)")
    print(f"{'P':>3} {'M':>3} {'side':>9} {'moves':>7} {'descent s':>10} {'moves/s':>9} {'worst span':>11}"
          f" {'speed-up':>9}")
    ok = True
    for p, m in DESCENTS:
        problem, split, seed = descent_problem(p, m, folder)
        rows = {}
        with counted(fuse.FuseSearch) as tally:
            rows["this"] = (tally, this_descents(split, seed, time.monotonic() + 600))
        if previous is not None:
            with counted(previous.FuseSearch) as tally:
                rows["previous"] = (tally, previous_descents(previous, problem, seed, time.monotonic() + 600))
        for side, (tally, key) in rows.items():
            speed = ratio(rows["previous"][0]["seconds"], tally["seconds"]) if side == "this" and "previous" in rows \
                else ""
            print(f"{p:>3} {m:>3} {side:>9} {tally['moves']:>7} {tally['seconds']:>10.2f} {rate(tally):>9.0f}"
                  f" {key[0]:>11.6g} {speed:>9}")
        if "previous" in rows and rows["previous"][1] != rows["this"][1]:
            print(f"    DIFFERENT results: previous {rows['previous'][1]}, this {rows['this'][1]}")
            ok = False
    print("(worst span in integer units; speed-up = previous descent seconds / this)")
    return ok


# -- 2. optimize auto at its default limit -----------------------------------------------------------------


def auto(previous, folder: str, time_limit: float) -> bool:
    print(f"\n2. optimize 1f1b --costs FILE (auto, --time-limit {time_limit:g}), the previous fuse search swapped in")
    print(f"{'P':>3} {'M':>3} {'side':>9} {'moves':>7} {'descent s':>10} {'moves/s':>9} {'worst span':>11}"
          f" {'bubble':>7} {'bound':>7} {'found by':>9} {'s':>6}  {'moves/s ratio':>13} {'span ratio':>10}")
    ok = True
    for p, m in AUTO:
        schedule = schedule_of(p, m, folder)
        sides = [("previous", previous_adapter(previous))] if previous is not None else []
        rows = {}
        for side, replacement in sides + [("this", fuse.FuseSearch)]:
            with fuse_search_as(replacement), counted(previous.FuseSearch if side == "previous" else fuse.FuseSearch) \
                    as tally:
                result = optimize(schedule, time_limit=time_limit)
            rows[side] = (tally, result)
        for side, (tally, result) in rows.items():
            theirs = rows.get("previous")
            extra = ""
            if side == "this" and theirs:
                extra = f"{ratio(rate(tally), rate(theirs[0])):>13} " \
                        f"{ratio(result.after.max_span, theirs[1].after.max_span):>10}"
            print(f"{p:>3} {m:>3} {side:>9} {tally['moves']:>7} {tally['seconds']:>10.2f} {rate(tally):>9.0f}"
                  f" {result.after.max_span:>11.5g} {result.after.least_work_bubble_rate:>7.4f} {result.bound:>7.4f}"
                  f" {result.found_by:>9} {result.seconds:>6.2f}  {extra}")
        if "previous" in rows:
            ok &= rows["this"][1].after.max_span <= rows["previous"][1].after.max_span + 1e-9
    print("(worst span in ms; bubble of the least work; moves/s ratio = this / previous; span ratio = this / previous)")
    return ok


# -- 3. explicit greedy and exact ---------------------------------------------------------------------------


def strategies(folder: str, time_limit: float) -> bool:
    print(f"\n3. explicit strategies (--time-limit {time_limit:g}): without the fuse pass (as before) and with it")
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
    previous = load_previous()
    if previous is None:
        print(f"(the previous fuse search, commit {PREVIOUS}, is not in this checkout's history: "
              "its columns are left out)")
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}\n")
    ok = True
    with tempfile.TemporaryDirectory() as folder:
        if "descents" in parts:
            ok &= descents(previous, folder)
        if "auto" in parts:
            ok &= auto(previous, folder, args.time_limit)
        if "strategies" in parts:
            ok &= strategies(folder, args.time_limit)
    print(f"\nload average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print("all checks passed" if ok else "SOME CHECK FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
