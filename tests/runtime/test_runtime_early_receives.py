"""Receives posted ahead of the program (gloo, from the second step on) give the same gradients, bit for
bit, as receives posted where the program posts them."""

from __future__ import annotations

import pytest

import pipeforge
from pipeforge.generator import codegen
from pipeforge.tools.launch import spawn

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(300)]


@pytest.mark.parametrize("ranks, names", [(2, ["zbv", "chimera"]), (4, ["1f1b", "interleaved-1f1b"])])
def test_early_receives_change_nothing_but_when_receives_are_posted(ranks, names, tmp_path):
    paths = [str(codegen(pipeforge.load(name, defines={"P": ranks, "M": 2 * ranks}), tmp_path / name))
             for name in names]
    outcomes = spawn("tests.runtime.early_jobs:run", ranks, paths, timeout=30, deadline=240)
    assert all(o.ok for o in outcomes), "\n".join(o.error for o in outcomes if not o.ok)
    for index, name in enumerate(names):
        for rank, outcome in enumerate(outcomes):
            report = outcome.value[index]
            assert report["diff"] == 0.0, (name, rank)
            first, *later = [sorted(posted.split()) for posted in report["early_posts"]]
            every = report["receives"][0]  # every receive of the program, as the first step posted them
            if len(every) > 1:  # the first step learns the shapes: receives go where the program posts them
                assert first != every, (name, rank)
            for posted in later:  # later steps post every receive ahead of the program, together
                assert posted == every, (name, rank, posted)
