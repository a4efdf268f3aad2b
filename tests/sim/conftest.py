"""Make tests/sim/sim_orders.py importable from tests/sim and tests/render however pytest is invoked."""

import sys
from pathlib import Path

HERE = str(Path(__file__).resolve().parent)
if HERE not in sys.path:
    sys.path.insert(0, HERE)
