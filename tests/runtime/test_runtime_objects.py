"""``pipeforge.runtime.objects`` on gloo ranks where ``Tensor.numpy`` fails, as without numpy installed.

torch's ``all_gather_object`` and ``broadcast_object_list`` decode with ``tensor.numpy()``; the runtime's
first-step check used them, so a generated pipeline's first ``step()`` (and ``pipeforge run``) raised
"Numpy is not available" in an environment of torch alone (what the README asks to install).
Values of unequal sizes on each rank come back whole and in rank order; the check runs and matches.
"""

from __future__ import annotations

import pytest

import pipeforge
from pipeforge.generator import codegen
from pipeforge.tools.launch import spawn

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(300)]


def test_objects_gather_broadcast_and_a_first_step_need_no_numpy(tmp_path):
    module = codegen(pipeforge.load("1f1b", defines={"P": 3, "M": 3}), tmp_path)
    outcomes = spawn("tests.runtime.objects_jobs:without_numpy", 3, str(module), timeout=60)
    assert all(o.ok for o in outcomes), "\n".join(o.error for o in outcomes if not o.ok)
    import torch

    want = [[None, "x" * 5000, {"rank": r, "shape": (2, 3), "dtype": torch.float64}][: r + 1] for r in range(3)]
    for outcome in outcomes:
        assert outcome.value["gathered"] == want
        assert outcome.value["broadcast"] == [("from", src, "y" * src * 700) for src in range(3)]
        assert outcome.value["match"]
