"""verify's cost with every (stage, microbatch) recomputed or offloaded, beside the plain schedule.

The interleaved 1F1B schedule at P x M x 2, as the library writes it ("plain"), with
``recompute`` (an R before each B) and with ``offload`` (an OFFLOAD after each F and a
RELOAD before its B) over every (stage, microbatch): ``verify`` in this process, timed
in its CPU seconds (another process's load lengthens one run's wall clock and not
another's), interleaved in rounds so that a burst of load falls on all three alike; the
least of ``--repeat`` rounds each. The ratios are against "plain": whole, and per
action (lowered, as verify checks them: recompute adds one to each pair, offload two), the figure that says
whether an R, OFFLOAD or RELOAD costs the verifier more than an F or a B. The target
(the bound of the timed test this replaced): the whole ratio at most 2 for both.

    python -m benchmarks.verify.memory_actions                # 64 x 256 x 2, 3 rounds
    python -m benchmarks.verify.memory_actions --size 32 128  # another P and M
"""

from __future__ import annotations

import argparse
import time

import pipeforge
from pipeforge.ir import Schedule
from pipeforge.passes.recompute import offload, recompute
from pipeforge.verifier import verify

WHOLE_TARGET = 2.0  # each variant's verify against the plain schedule's, CPU


def actions(schedule: Schedule) -> int:
    """The actions verify checks: the schedule's own with the sends and receives lowering writes."""
    return pipeforge.lower(schedule).action_count()


def measure(schedules: dict[str, Schedule], repeat: int) -> dict[str, float]:
    least = {name: float("inf") for name in schedules}
    for _ in range(repeat):
        for name, schedule in schedules.items():
            started = time.process_time()
            if not verify(schedule).valid:
                raise SystemExit(f"{name}: verify found the schedule invalid")
            least[name] = min(least[name], time.process_time() - started)
    return least


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", nargs=2, type=int, default=(64, 256), metavar=("P", "M"))
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    ranks, microbatches = args.size
    plain = pipeforge.load("interleaved-1f1b", defines={"P": ranks, "M": microbatches})
    schedules = {"plain": plain, "recompute": recompute(plain), "offload": offload(plain)}
    least = measure(schedules, args.repeat)
    counts = {name: actions(schedule) for name, schedule in schedules.items()}
    print(f"interleaved 1F1B {ranks} x {microbatches} x 2, least of {args.repeat} rounds, verify's CPU seconds")
    for name, count in counts.items():
        whole = least[name] / least["plain"]
        per_action = (least[name] / count) / (least["plain"] / counts["plain"])
        note = "" if name == "plain" else f"target <= {WHOLE_TARGET:g}x whole: {'met' if whole <= WHOLE_TARGET else 'NOT met'}"
        print(f"  {name:9s} {count:7d} actions  {least[name]:6.2f} s  {whole:4.2f}x whole  "
              f"{per_action:4.2f}x per action  {note}")

if __name__ == "__main__":
    main()
