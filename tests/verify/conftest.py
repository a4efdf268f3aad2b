"""The differential tests' count, printed at the end of the run (the note quotes it)."""

from __future__ import annotations

import sys


def pytest_terminal_summary(terminalreporter):
    module = sys.modules.get("test_oracle_agreement") or sys.modules.get("tests.verify.test_oracle_agreement")
    counts = getattr(module, "AGREED", None)
    if not counts or not any(counts.values()):
        return
    terminalreporter.write_line(
        f"verify differential: {sum(counts.values())} verdicts agreed with the oracle, z3 deciding "
        f"({counts[False]} compute-only, {counts[True]} with communication; each semantics counted)")
