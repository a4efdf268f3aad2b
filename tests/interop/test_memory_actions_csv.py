"""torch's CSV has no recompute or offload: writing one refuses with the action and its place; nothing is written."""

from __future__ import annotations

import subprocess
import sys

import pytest

import pipeforge
from pipeforge.errors import PipeforgeError
from pipeforge.interop.torch_csv import to_csv_text
from pipeforge.passes.recompute import offload, recompute

TEXT = """schedule rc(P = 2, M = 2) {
    ranks P
    stages P placement loop
    microbatches M
    rank 0 { 0F0 0F1 0R0 0B0 0R1 0B1 }
    rank 1 { 1F0 1R0 1B0 1F1 1R1 1B1 }
}
"""


@pytest.mark.parametrize("format", ["compute_only", "compute_comms"])
@pytest.mark.parametrize("transform, kind", [(recompute, "R"), (offload, "OFFLOAD")])
def test_writing_a_recompute_or_offload_to_torch_csv_refuses(transform, kind, format):
    schedule = transform(pipeforge.load("1f1b", defines={"P": 2, "M": 2}))
    with pytest.raises(PipeforgeError, match=rf"torch CSV has no {kind} action: '\d{kind}\d' \(rank \d, step \d+"):
        to_csv_text(schedule, format)


@pytest.mark.parametrize("command", [["convert", "rc.pipe", "out.csv"], ["lower", "rc.pipe", "-o", "out.csv"]])
def test_convert_and_lower_refuse_with_the_place_and_write_nothing(tmp_path, command):
    (tmp_path / "rc.pipe").write_text(TEXT)
    done = subprocess.run([sys.executable, "-m", "pipeforge", *command], cwd=tmp_path, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 2, done.stderr
    assert "torch CSV has no R action: '0R0'" in done.stderr and "rc.pipe:5:22" in done.stderr
    assert "Traceback" not in done.stderr and not (tmp_path / "out.csv").exists()


def test_the_pipe_text_round_trips():
    """R, OFFLOAD, RELOAD, their costs and the checkpoint print as .pipe text that reads back the same."""
    from dataclasses import replace

    from pipeforge.ir import CostModel, MemorySpec
    from pipeforge.lang.printer import print_schedule

    plain = pipeforge.load("1f1b", defines={"P": 2, "M": 4})
    schedule = offload(recompute(plain, [(0, 0, 0), (1, 2, 0)]), [(0, 1, 0), (1, 3, 0)])
    schedule = replace(schedule, costs=CostModel(R=0.5, OFFLOAD=0.25, RELOAD=0.3),
                       memory=MemorySpec(2.5, checkpoint=0.05, checkpoints=(0.1, 0.2)))
    text = print_schedule(schedule)
    assert "0R0" in text and "0OFFLOAD1" in text and "R = 0.5" in text and "checkpoint[1] = 0.2" in text
    again = pipeforge.loads(text)
    assert again.programs == schedule.programs and again.costs == schedule.costs and again.memory == schedule.memory
