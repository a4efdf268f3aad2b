"""The verifier's route to libz3 (SMT-LIB text through ctypes, no z3 bindings) against the z3-solver on sys.path.

Run by scripts/check_z3_versions.sh with one z3-solver version first on PYTHONPATH: libz3 must load
from that package's own folder (not the bindings' private fallback), and verify must certify, solve,
and prove a wait cycle with it.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import sys

import pipeforge
from pipeforge.verifier import model

expected = sys.argv[1]
folder = os.path.dirname(importlib.util.find_spec("z3").origin)
assert folder.startswith(expected), f"z3 comes from {folder}, not {expected}"
lib = model.load_libz3()
assert os.path.dirname(lib._name) == os.path.join(folder, "lib"), f"libz3 loaded from {lib._name}"
assert "z3" not in sys.modules, "the z3 bindings were imported"

valid = pipeforge.load("zb-h1", defines={"P": 4, "M": 8})
for semantics in ("rendezvous", "buffered", "nccl"):
    report = pipeforge.verify(valid, semantics=semantics, solve=True)
    assert report.valid and report.solved and report.certified, (semantics, report.render())
assert pipeforge.verify(valid, solve=False).certified
stuck = pipeforge.loads("schedule s { ranks 2 stages 2 placement loop microbatches 1\n"
                        "  rank 0 { 0RECV_B0 0F0 0SEND_F0 0B0 } rank 1 { 1RECV_F0 1F0 1B0 1SEND_B0 } }")
report = pipeforge.verify(stuck, solve=True)
assert report.kinds() == {"deadlock"}, report.render()
assert "z3" not in sys.modules
version = importlib.metadata.version("z3-solver")
print(f"z3-solver {version}: libz3 loaded by path; certify, solve and the unsat core agree")
