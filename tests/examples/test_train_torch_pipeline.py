"""examples/train_torch_pipeline.py runs under torchrun on CPU: torch's pipeline() split of GPT-2 trains; loss falls."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def torchrun(*args: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
               str(ROOT / "examples" / "train_torch_pipeline.py"), "--steps", "4", "--timeout", "60", *args]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    return subprocess.run(command, capture_output=True, text=True, timeout=240, cwd=ROOT, env=env, check=False)


@pytest.mark.distributed
@pytest.mark.timeout(300)
@pytest.mark.parametrize("schedule, last_rank", [("1f1b", 1), ("zbv", 0)])
def test_train_torch_pipeline_trains(schedule, last_rank):
    result = torchrun("--schedule", schedule)
    assert result.returncode == 0, result.stderr[-3000:]
    lines = re.findall(r"rank (\d+): loss ([\d.]+) -> ([\d.]+) after 4 steps", result.stdout)
    assert len(lines) == 1 and int(lines[0][0]) == last_rank, result.stdout
    assert float(lines[0][2]) < float(lines[0][1])
