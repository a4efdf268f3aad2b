"""The render tests share the simulator tests' hand-built schedules (tests/sim/sim_orders.py)."""

import sys
from pathlib import Path

SIM_TESTS = str(Path(__file__).resolve().parents[1] / "sim")
if SIM_TESTS not in sys.path:
    sys.path.insert(0, SIM_TESTS)
