"""The public face: pipeforge.load/verify/simulate/optimize/codegen, whatever was imported before."""

import importlib
import subprocess
import sys

import pipeforge

SCRIPT = """
import pipeforge
sched = pipeforge.load("1f1b", defines={"P": 2, "M": 2})
assert pipeforge.verify(sched).valid                       # before the subpackage is imported
import pipeforge.verify, pipeforge.optimize, pipeforge.codegen
from pipeforge.verify import Report
assert isinstance(pipeforge.verify(sched), Report)         # after: the module calls its function
assert pipeforge.verify.verify(sched).valid                # and is still the module
assert pipeforge.simulate(sched).makespan == 9.0           # P=2, M=2, unit costs: 2 + 2*3 + 1
result = pipeforge.optimize(sched, strategy="greedy")
assert result.schedule is not None
print("ok")
"""


def test_public_functions_survive_importing_their_submodules():
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


def test_codegen_is_callable_and_writes_a_module(tmp_path):
    sched = pipeforge.load("1f1b", defines={"P": 2, "M": 2})
    importlib.import_module("pipeforge.codegen")  # rebinds the attribute to the module

    path = pipeforge.codegen(sched, tmp_path)
    assert path.exists() and "def make_pipeline" in path.read_text()


def test_loads_elaborates_text():
    sched = pipeforge.loads("schedule s { ranks 1 stages 1 placement loop microbatches 1 rank 0 { 0F0 0B0 } }")
    assert sched.ranks == 1 and len(sched.programs[0]) == 2
