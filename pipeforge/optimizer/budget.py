"""The time limit covers the final check: how long the search may run.

``finish_seconds(actions, compile_seconds)``: a conservative estimate of what building the chosen
order's schedule, verifying it and printing it will take (the larger of ``FINISH_PER_ACTION_S`` a
compute action and ``FINISH_PER_COMPILE`` times the work graph's compile time in this process, plus
``FINISH_FIXED_S``); ``search_deadline(started, time_limit, finish)``: when the search must stop to
leave it that time. The measurements behind the factors: ``benchmarks/README.md``.
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
