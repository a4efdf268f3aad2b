"""The time limit covers the whole run, the final verification and the writing included (``budget.py``).

Not timed tests of speed: each case runs the search to its deadline and checks
that what follows (building, verifying and writing the result) still ends
within the limit, with generous slack for a loaded machine.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

import pipeforge
from pipeforge.ir import CostModel
from pipeforge.optimizer import optimize
from pipeforge.optimizer.budget import FINISH_FIXED_S, finish_seconds, search_deadline
from tests.load import scaled

SLACK_S = scaled(1.0)   # past the limit, for what a loaded machine adds to the estimate
START_UP_SLACK_S = scaled(2.0)  # the interpreter's start-up and imports on a loaded machine
# 14.6B's profile at p = 16, m = 48 (the paper's Table 5): no order reaches the bound at 1.125p (18 M_B),
# nor at 1p with V placements, so the search runs to its deadline (at 2p the Zero Bubble builder's fill
# chain settings now reach the bound at once)
COSTS = "F=11.347,I=11.248,W=8.132,comm=0.377,weights=0.432"


def test_the_finish_grows_with_the_schedule_and_with_how_slow_the_machine_is():
    assert finish_seconds(0, 0.0) == FINISH_FIXED_S
    assert finish_seconds(10_000, 0.01) < finish_seconds(100_000, 0.01)
    assert finish_seconds(10_000, 0.01) < finish_seconds(10_000, 1.0)


def test_the_search_deadline_leaves_the_finish_and_never_precedes_the_start():
    assert search_deadline(100.0, 10.0, 2.5) == 107.5
    assert search_deadline(100.0, 1.0, 2.5) == 100.0


def test_optimize_ends_within_its_limit_verification_included():
    schedule = pipeforge.load("1f1b", defines={"P": 16, "M": 96})
    costs = CostModel(F=11.347, I=11.248, W=8.132, comm=0.377)
    started = time.monotonic()
    result = optimize(schedule, costs=costs, memory_limit=18, weights=0.432, time_limit=2.0)
    wall = time.monotonic() - started
    assert result.stopped == "time"  # the case is one that runs to the deadline
    assert result.seconds <= 2.0 + SLACK_S and wall <= 2.0 + SLACK_S


def _command(tmp_path, *argv) -> tuple[float, dict]:
    out = tmp_path / "o.pipe"
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "pipeforge", "optimize", "1f1b", *argv, "-o", str(out), "--json"],
                          capture_output=True, text=True, timeout=120)
    wall = time.monotonic() - started
    assert done.returncode == 0, done.stderr
    assert pipeforge.verify(pipeforge.load(str(out))).valid
    return wall, json.loads(done.stdout)


@pytest.mark.slow
@pytest.mark.parametrize("placement, memory", [("keep", "18"), ("any", "16")])
def test_the_command_returns_within_its_time_limit(tmp_path, placement, memory):
    """1.125p with the input's placement, and 1p with the V placements tried (twice the actions)."""
    limit = 3.0
    wall, data = _command(tmp_path, "-D", "P=16", "-D", "M=48", "--memory-limit", memory, "--cost", COSTS,
                          "--placement", placement, "--time-limit", str(limit))
    assert data["stopped"] == "time"
    assert data["seconds"] <= limit + SLACK_S
    assert wall <= limit + SLACK_S + START_UP_SLACK_S


@pytest.mark.slow
def test_exact_search_returns_within_its_time_limit(tmp_path):
    """The issue's contract: ``--strategy exact --time-limit 2`` returns within 3 s (a model exact search
    accepts but does not settle in 2 s)."""
    wall, data = _command(tmp_path, "-D", "P=4", "-D", "M=8", "--memory-limit", "3", "--cost",
                          "F=1.1,I=1.3,W=0.7,comm=0.3", "--strategy", "exact", "--time-limit", "2")
    assert data["stopped"] == "time"
    assert data["seconds"] <= 2.0 + SLACK_S
    assert wall <= 2.0 + SLACK_S + START_UP_SLACK_S
