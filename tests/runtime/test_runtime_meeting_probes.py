"""A rank at a meeting after a failed step looks for gone ranks ever less often: each look leaves one receive
posted per live rank until the next meeting, so looking at every poll piled them up (one per missing rank
every 50 ms of a wait that may last minutes); a rank that dies is still named within about a second."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest

from pipeforge.runtime.context import ScheduleInfo
from pipeforge.runtime.p2p import PipelineError
from pipeforge.runtime.recovery import StepStart

INFO = ScheduleInfo("one_f_one_b", 3, 3, 4, ((0, 1, 2),))


class Store:
    """A meeting's store where rank 1's key appears ``late`` seconds after the start (rank 2's at once)."""

    def __init__(self, late: float):
        self.started, self.late = time.monotonic(), late

    def check(self, keys: list[str]) -> bool:
        return keys != ["1"] or time.monotonic() - self.started >= self.late


class Alive:
    """A liveness group counting the receives posted on it; rank 1's connection closes after ``dies`` s."""

    def __init__(self, dies: float = float("inf")):
        self.started, self.dies, self.posted = time.monotonic(), dies, 0

    def recv(self, tensors, rank: int, tag: int):
        if rank == 1 and time.monotonic() - self.started >= self.dies:
            raise RuntimeError("Connection closed by peer")
        self.posted += 1
        return object()


def test_a_long_wait_leaves_a_few_probes_not_one_per_poll():
    start = StepStart(INFO, 0)
    start.alive = Alive()
    start._await(Store(late=2.0), timedelta(seconds=30))
    assert start.alive.posted == len(start._probes) <= 8  # at every 50 ms poll: about 40


def test_a_rank_that_dies_while_missing_is_still_named_within_about_a_second():
    start = StepStart(INFO, 0)
    start.alive = Alive(dies=0.3)
    began = time.monotonic()
    with pytest.raises(PipelineError, match=r"rank\(s\) 1 are gone"):
        start._await(Store(late=60.0), timedelta(seconds=30))
    assert time.monotonic() - began < 1.5
