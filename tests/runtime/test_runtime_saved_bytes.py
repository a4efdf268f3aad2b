"""The saved-tensor accounting (``runtime/saved.py``): what it counts once, and that a split backward
leaves nothing saved behind under its hooks (a saved output held as itself made a cycle through autograd
that outlived W: 7,872 of a GPT stage's 12,936 bytes a microbatch, every microbatch)."""

from __future__ import annotations

import gc

import torch

from pipeforge.runtime.saved import SavedBytes, counted, saved_key
from pipeforge.runtime.stage import StageRunner
from tests.zoo import models as zoo


def test_a_tensor_counts_once_a_slice_its_own_bytes():
    counter = SavedBytes()
    x = torch.zeros(4, 6, dtype=torch.float64)
    keys = [counter.add(t) for t in (x, x.t(), x.view(-1), x[1:])]
    assert counter.held == x.nbytes + x[1:].nbytes and counter.peak == counter.held
    assert saved_key(torch.zeros(0)) is None
    for key in keys:
        counter.drop(key)
    assert counter.held == 0 and counter.peak == x.nbytes + x[1:].nbytes


def test_forward_input_weight_leave_nothing_saved():
    stage = zoo.build("gpt-dropout", 2)[1]
    runner = StageRunner(stage, 1, 0, False, True, zoo.loss_fn)
    _, targets, _ = zoo.batch("gpt-dropout", 6, 0)
    counter = SavedBytes()
    parameters = {p.untyped_storage().data_ptr() for p in stage.parameters()}
    for mb in range(3):
        with counted(counter, parameters):
            runner.forward(mb, (torch.randn(2, zoo.SEQ, zoo.WIDTH, dtype=torch.float64),), targets[2 * mb:2 * mb + 2],
                           True)
    held = counter.held
    assert held > 0
    for mb in range(3):
        runner.backward_input(mb, None)
    assert counter.held == held  # I keeps the graph for W
    for mb in range(3):
        runner.backward_weight(mb)
    gc.collect()
    assert counter.held == 0
