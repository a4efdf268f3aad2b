"""examples/train_gpt.py runs under torchrun on CPU and trains: the loss falls."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from pipeforge.cli import main

ROOT = Path(__file__).resolve().parents[2]
TINY = ["--steps", "4", "--layers", "4", "--width", "16", "--heads", "2", "--seq", "8", "--vocab", "32",
        "--rows", "8", "--microbatches", "4", "--lr", "1e-2", "--timeout", "60"]


def torchrun(*args: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
               str(ROOT / "examples" / "train_gpt.py"), *TINY, *args]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    return subprocess.run(command, capture_output=True, text=True, timeout=240, cwd=ROOT, env=env)


def falling_loss(result: subprocess.CompletedProcess) -> None:
    assert result.returncode == 0, result.stderr[-3000:]
    lines = re.findall(r"rank (\d+): loss ([\d.]+) -> ([\d.]+) after 4 steps", result.stdout)
    assert len(lines) == 1, result.stdout  # one rank holds the last stage
    _, first, last = lines[0]
    assert float(last) < float(first)


@pytest.mark.distributed
@pytest.mark.timeout(300)
def test_train_gpt_with_a_module_generated_at_startup():
    # interleaved: each of the 2 ranks holds 2 stages (stages_of_rank), rank 1 the last
    result = torchrun("--schedule", "interleaved-1f1b")
    falling_loss(result)
    assert "rank 1 (stages [1, 3]): step 3 loss" in result.stdout


@pytest.mark.distributed
@pytest.mark.timeout(300)
def test_train_gpt_with_a_codegen_module(tmp_path):
    module = tmp_path / "gpipe_2.py"
    assert main(["codegen", "gpipe", "-D", "P=2", "-D", "M=4", "-o", str(module)]) == 0
    result = torchrun("--module", str(module))
    falling_loss(result)
    assert "rank 1 (stages [1]): step 0 loss" in result.stdout
