"""Library calls leave the caller's process as they found it: the garbage collector runs during them."""

from __future__ import annotations

import gc

import pytest

import pipeforge
from pipeforge.cli import main


@pytest.fixture
def collections():
    """How many collections the collector started while the test ran (none if it was switched off)."""
    started: list[int] = []

    def count(phase: str, info: dict) -> None:
        if phase == "start":
            started.append(info["generation"])

    gc.callbacks.append(count)
    yield started
    gc.callbacks.remove(count)


@pytest.mark.parametrize("call", [
    lambda s: pipeforge.verify(s),
    lambda s: pipeforge.simulate(s).bounds,
    lambda s: pipeforge.optimize(s, strategy="greedy", time_limit=5),
])
def test_a_library_call_keeps_the_collector_running(call, collections):
    schedule = pipeforge.load("zb-h1", defines={"P": 4, "M": 16})
    assert gc.isenabled()
    call(schedule)
    assert gc.isenabled()
    assert collections, "no collection ran during the call: the collector was switched off"


def test_optimize_leaves_a_switched_off_collector_switched_off(collections):
    schedule = pipeforge.load("1f1b", defines={"P": 2, "M": 4})
    gc.disable()
    try:
        pipeforge.optimize(schedule, strategy="greedy", time_limit=5)
        assert not gc.isenabled()
    finally:
        gc.enable()
    assert not collections


def test_the_command_line_pauses_the_collector_for_the_command_and_restores_it(capsys, collections):
    schedule = pipeforge.load("zb-h1", defines={"P": 4, "M": 16})
    pipeforge.verify(schedule)
    in_library = len(collections)
    collections.clear()
    assert main(["verify", "zb-h1", "-D", "P=4", "-D", "M=16", "--json"]) == 0
    assert gc.isenabled()
    # the same work started collections in the library call; the command ran with none (one may start as
    # the collector is switched back on, when the command is done)
    assert in_library >= 3 and len(collections) <= 1
