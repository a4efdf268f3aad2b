"""Ties by construction: an optimizer that lists a shared parameter twice is warned about, naming it."""

from __future__ import annotations

import pytest

import pipeforge
from pipeforge.generator import codegen
from pipeforge.tools.launch import spawn


@pytest.mark.distributed
@pytest.mark.timeout(300)
def test_an_optimizer_listing_the_tied_weight_twice_is_warned_about_by_name(tmp_path):
    """ZBV's rank 0 holds stage 0 (the embedding) and stage 3 (the LM head tied to it): one Parameter."""
    path = str(codegen(pipeforge.load("zbv", defines={"P": 2, "M": 4}), tmp_path))
    outcomes = spawn("tests.models.pipeline_jobs:optimizer_warnings", 2, path, timeout=60, deadline=240)
    assert all(o.ok for o in outcomes), "\n".join(o.error for o in outcomes)
    first, second = (o.value for o in outcomes)
    assert len(first["stage modules"]) == 1, first
    message = first["stage modules"][0]
    assert "rank 0" in message and "stage 0 'embed.weight' = stage 3 'head.weight' (2 times)" in message
    assert "pipe.parameters()" in message
    assert first["pipe.parameters()"] == [] and second == {"stage modules": [], "pipe.parameters()": []}
