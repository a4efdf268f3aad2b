"""An example of ``examples/`` run under torchrun on CPU (2 local processes), and the loss it reports.

``torchrun(script, *args)`` runs ``examples/<script>`` with the repository on ``PYTHONPATH``;
``falling_loss(result, last_rank)`` asserts it exited 0 and that one rank (``last_rank``
where given: the one holding the last stage) printed a loss that fell over its 4 steps.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def torchrun(script: str, *args: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
               str(ROOT / "examples" / script), *args]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    return subprocess.run(command, capture_output=True, text=True, timeout=240, cwd=ROOT, env=env, check=False)


def falling_loss(result: subprocess.CompletedProcess, last_rank: int | None = None) -> None:
    assert result.returncode == 0, result.stderr[-3000:]
    lines = re.findall(r"rank (\d+): loss ([\d.]+) -> ([\d.]+) after 4 steps", result.stdout)
    assert len(lines) == 1, result.stdout  # one rank holds the last stage
    rank, first, last = lines[0]
    assert last_rank is None or int(rank) == last_rank, result.stdout
    assert float(last) < float(first)
