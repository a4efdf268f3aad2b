"""verify on R, OFFLOAD and RELOAD: one hand case per new violation, its kind, place, message and caret."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import pipeforge
from pipeforge.ir import MemorySpec
from pipeforge.verifier import verify

HEAD = """schedule case(P = 2, M = 2) {
    ranks P
    stages P placement loop
    microbatches M
"""


def report_of(rank0: str, rank1: str = "1F0 1B0 1F1 1B1", memory: str = ""):
    text = HEAD + (f"    memory {{ {memory} }}\n" if memory else "") + f"    rank 0 {{ {rank0} }}\n    rank 1 {{ {rank1} }}\n}}\n"
    return verify(pipeforge.loads(text)), text


# (name, rank 0's steps, rank 1's steps, memory, [(kind, rank, step, words of the message)])
CASES = [
    ("recomputed everywhere: valid", "0F0 0F1 0R0 0B0 0R1 0B1", "1F0 1R0 1B0 1F1 1R1 1B1", "", []),
    ("offloaded: valid", "0F0 0OFFLOAD0 0F1 0RELOAD0 0B0 0B1", "1F0 1B0 1F1 1B1", "", []),
    ("R before its F", "0R0 0F0 0B0 0F1 0B1", None, "", [("order", 0, 0, "0R0 needs 0F0 earlier")]),
    ("R after its backward", "0F0 0B0 0R0 0F1 0B1", None, "", [("order", 0, 1, "0B0 needs 0R0 earlier")]),
    ("R on the wrong rank", "0F0 0B0 0F1 0B1", "1F0 0R0 1B0 1F1 1B1", "",
     [("placement", 1, 1, "0R0")]),
    ("R with no F", "0R0 0B0 0F1 0B1", None, "", [("missing", 0, None, "no forward 0F0")]),
    ("R twice", "0F0 0R0 0R0 0B0 0F1 0B1", None, "", [("duplicate", 0, 2, "0R0 again")]),
    ("R and OFFLOAD of one microbatch", "0F0 0OFFLOAD0 0R0 0RELOAD0 0B0 0F1 0B1", None, "",
     [("duplicate", 0, 2, "0R0: stage 0 microbatch 0 already has OFFLOAD or RELOAD"),
      ("duplicate", 0, 3, "0RELOAD0: stage 0 microbatch 0 already has R")]),
    ("RELOAD without OFFLOAD", "0F0 0RELOAD0 0B0 0F1 0B1", None, "",
     [("missing", 0, None, "0RELOAD0 without 0OFFLOAD0")]),
    ("OFFLOAD without RELOAD", "0F0 0OFFLOAD0 0B0 0F1 0B1", None, "",
     [("missing", 0, None, "0OFFLOAD0 without 0RELOAD0")]),
    ("RELOAD before OFFLOAD", "0F0 0RELOAD0 0OFFLOAD0 0B0 0F1 0B1", None, "",
     [("order", 0, 1, "0RELOAD0 needs 0OFFLOAD0 earlier")]),
    ("OFFLOAD before its F", "0OFFLOAD0 0F0 0RELOAD0 0B0 0F1 0B1", None, "",
     [("order", 0, 0, "0OFFLOAD0 needs 0F0 earlier")]),
    ("backward while away", "0F0 0OFFLOAD0 0B0 0RELOAD0 0F1 0B1", None, "",
     [("order", 0, 2, "0B0 needs 0RELOAD0 earlier")]),
    ("I while away (W after the RELOAD)", "0F0 0OFFLOAD0 0I0 0RELOAD0 0W0 0F1 0B1", None, "",
     [("order", 0, 2, "0I0 needs 0RELOAD0 earlier")]),
    # limit 1.5, checkpoint 0.25: F0 F1 hold 0.5, R0 takes it to 1.25 (fits), R1 before B0 to 2
    ("memory: two recomputes at once", "0F0 0F1 0R0 0R1 0B0 0B1", "1F0 1B0 1F1 1B1",
     "limit = 1.5  checkpoint = 0.25", [("memory", 0, 3, "holds 2 M_B of activations at 0R1, over the limit 1.5")]),
    # limit 1: the offload makes room for F1, and the reload of microbatch 0 beside it does not fit
    ("memory: a reload while another microbatch is held", "0F0 0OFFLOAD0 0F1 0RELOAD0 0B0 0B1",
     "1F0 1B0 1F1 1B1", "limit = 1", [("memory", 0, 3, "holds 2 microbatches of activations at 0RELOAD0")]),
]


@pytest.mark.parametrize("name, rank0, rank1, memory, expected", CASES, ids=[c[0] for c in CASES])
def test_case(name, rank0, rank1, memory, expected):
    report, _ = report_of(rank0, rank1 or "1F0 1B0 1F1 1B1", memory)
    got = [(v.kind, v.rank, v.step, v.message) for v in report.violations]
    assert report.valid == (not expected), got
    assert len(got) == len(expected), got
    for (kind, rank, step, words), (k, r, s, message) in zip(expected, got):
        assert (kind, rank, step) == (k, r, s) and words in message, got


def test_every_new_violation_points_at_its_step_with_a_caret(tmp_path):
    """The command line's text: file:line:col of the offending step, the line, a caret under the action."""
    path = tmp_path / "away.pipe"
    path.write_text(HEAD + "    rank 0 { 0F0 0OFFLOAD0 0B0 0RELOAD0 0F1 0B1 }\n    rank 1 { 1F0 1B0 1F1 1B1 }\n}\n")
    done = subprocess.run([sys.executable, "-m", "pipeforge", "verify", str(path)], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 1, done.stderr
    lines = done.stdout.splitlines()
    at = next(i for i, line in enumerate(lines) if "away.pipe:5:28: order: 0B0 needs 0RELOAD0 earlier" in line)
    assert lines[at + 1].strip().startswith("rank 0 {") and lines[at + 2].strip() == "^^^"
    assert lines[at + 2].index("^") == lines[at + 1].index("0B0")
    done = subprocess.run([sys.executable, "-m", "pipeforge", "verify", "--json", str(path)], capture_output=True,
                          text=True, timeout=120)
    violation = json.loads(done.stdout)["violations"][0]
    assert violation == {"kind": "order", "message": "0B0 needs 0RELOAD0 earlier on rank 0", "rank": 0, "step": 2,
                         "location": f"{path}:5:28"}


def test_the_memory_check_counts_a_recomputed_forward_as_its_checkpoint():
    schedule = pipeforge.loads(HEAD + "    rank 0 { 0F0 0F1 0R0 0B0 0R1 0B1 }\n    rank 1 { 1F0 1R0 1B0 1F1 1R1 1B1 }\n}\n")
    from dataclasses import replace

    assert verify(replace(schedule, memory=MemorySpec(1.2, checkpoint=0.1))).valid  # at most 0.1 + 1
    assert not verify(replace(schedule, memory=MemorySpec(1.05, checkpoint=0.1))).valid
