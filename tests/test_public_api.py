"""The public face: pipeforge.load/verify/simulate/optimize/codegen are plain functions; the packages behind them have other names."""

import importlib
import subprocess
import sys

import pipeforge

SCRIPT = """
import pipeforge
sched = pipeforge.load("1f1b", defines={"P": 2, "M": 2})
assert pipeforge.verify(sched).valid                       # before the subpackage is imported
import pipeforge.verifier, pipeforge.optimizer, pipeforge.generator, pipeforge.inputs
from pipeforge.verifier import Report
assert isinstance(pipeforge.verify(sched), Report)         # after: still the function
assert pipeforge.verifier.verify(sched).valid                # the package keeps its own name
assert pipeforge.simulate(sched).makespan == 9.0           # P=2, M=2, unit costs: 2 + 2*3 + 1
result = pipeforge.optimize(sched, strategy="greedy")
assert result.schedule is not None
assert all(callable(getattr(pipeforge, name)) for name in ("load", "verify", "simulate", "optimize", "codegen"))
print("ok")
"""


def test_public_functions_survive_importing_their_submodules():
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


def test_codegen_is_callable_and_writes_a_module(tmp_path):
    sched = pipeforge.load("1f1b", defines={"P": 2, "M": 2})
    importlib.import_module("pipeforge.generator")

    path = pipeforge.codegen(sched, tmp_path)
    assert path.exists() and "def make_pipeline" in path.read_text()


def test_loads_elaborates_text():
    sched = pipeforge.loads("schedule s { ranks 1 stages 1 placement loop microbatches 1 rank 0 { 0F0 0B0 } }")
    assert sched.ranks == 1 and len(sched.programs[0]) == 2
