"""The time limit covers the final check: how long the search may run.

``optimize``'s time limit bounds the whole run: the search, then building the
chosen order's schedule, verifying it (``pipeforge.verify``, which nothing
skips) and, in the command, printing it. Those last steps take time that
grows with the schedule (about 25 µs per compute action on an idle core,
most of it ``verify``; they can take several times that on a loaded
machine), so the search stops early enough to leave them their time.

``finish_seconds`` estimates that time, conservatively, as the larger of a
fixed rate per compute action and a multiple of how long this very process
took to compile the same work graph (``sim.workgraph``: the same size and the
same kind of Python work, timed under the machine's current load), plus a
fixed start-up. On the Table 5 rows (up to 49,152 actions) the finish
measured 5-7x the compile time and 23-25 µs per action idle, and up to 65 µs
per action with twice as many runnable processes as cores; the factors below
keep 2-3x the idle figures (the compile time grows with the load too).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

FINISH_FIXED_S = 0.2         # start-up of the final check (z3's first model) and of the report
FINISH_PER_ACTION_S = 50e-6  # per compute action of the result, at least (measured idle: 23-25 µs)
FINISH_PER_COMPILE = 16.0    # times the seconds the work graph took to compile (measured: 5-7x)

T = TypeVar("T")


def timed(build: Callable[[], T]) -> tuple[T, float]:
    """``build()`` and the seconds it took."""
    started = time.monotonic()
    value = build()
    return value, time.monotonic() - started


def finish_seconds(actions: int, compile_seconds: float) -> float:
    """A conservative estimate of the time to turn an order of ``actions`` compute actions into the
    verified, written result, given that compiling their work graph took ``compile_seconds``."""
    return FINISH_FIXED_S + max(FINISH_PER_ACTION_S * actions, FINISH_PER_COMPILE * compile_seconds)


def search_deadline(started: float, time_limit: float, finish: float) -> float:
    """The ``time.monotonic()`` past which no search starts anything new: the limit less the finish
    (at ``started`` when the finish alone needs the whole limit: only the first greedy orders run)."""
    return started + max(0.0, time_limit - finish)
