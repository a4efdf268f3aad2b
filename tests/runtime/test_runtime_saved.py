"""R repeats dropout's masks, and the runtime counts the bytes of saved activations (runtime/saved.py).

Dropout on (0.3) in every block, 2 gloo ranks, float64: 1F1B with every microbatch recomputed, and with
every one offloaded, give bit for bit the losses and gradients of 1F1B without them, from the same seed,
and leave the global RNG where it was (R draws in a fork of it). The saved-tensor accounting of each rank
drops with recompute as simulate's peak predicts (1F1B holds P - r microbatches on rank r, full recompute
one), and so does offload (each F's saved tensors leave when its OFFLOAD runs): measured over predicted
within 5 % on every rank.
"""

from __future__ import annotations

import pytest

import pipeforge
from pipeforge.generator import codegen
from pipeforge.passes.recompute import offload
from pipeforge.tools.launch import spawn

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(600)]


def test_recompute_repeats_dropout_and_saves_less(tmp_path):
    plain = pipeforge.load("1f1b", defines={"P": 2, "M": 4})
    schedules = {"plain": plain, "recompute": pipeforge.load("1f1b-recompute", defines={"P": 2, "M": 4}),
                 "offload": offload(plain)}
    paths = {label: str(codegen(s, tmp_path / label)) for label, s in schedules.items()}
    outcomes = spawn("tests.runtime.saved_jobs:run", 2, paths, timeout=60, deadline=500)
    assert all(o.ok for o in outcomes), "\n".join(o.error for o in outcomes if not o.ok)
    for outcome in outcomes:
        got = outcome.value
        for label in ("recompute", "offload"):
            assert got[label]["losses"] == got["plain"]["losses"], label
            assert got[label]["grads"] == got["plain"]["grads"], label
            assert got[label]["rng_after"] == got["plain"]["rng_after"], label
    rank0 = outcomes[0].value
    assert outcomes[1].value["plain"]["losses"]  # the last stage's losses are there to compare
    plain_peak, rebuilt_peak = rank0["plain"]["saved_peak"], rank0["recompute"]["saved_peak"]
    assert plain_peak > 0 and rebuilt_peak > 0
    # simulate: rank 0 holds 2 microbatches in 1F1B (P = 2), 1 rebuilt (plus checkpoints) with recompute
    assert [pipeforge.simulate(s).peak_memory[0] for s in (plain, schedules["recompute"])] == [2.0, 1.0]
    assert rebuilt_peak < 0.75 * plain_peak
    # measured against predicted, rank by rank: simulate's peak (in microbatches) times the bytes of one
    # microbatch on that rank (measured where full recompute holds exactly one), within 5 %
    for label, schedule in schedules.items():
        predicted = pipeforge.simulate(schedule).peak_memory
        for rank, outcome in enumerate(outcomes):
            unit = outcome.value["recompute"]["saved_peak"]
            measured = outcome.value[label]["saved_peak"] / unit
            assert abs(measured - predicted[rank]) <= 0.05 * predicted[rank], (label, rank, measured, predicted)
