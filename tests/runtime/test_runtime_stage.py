"""One stage on one process: full backward (B) against the split backward (I then W)."""

from __future__ import annotations

import copy

import pytest
import torch

from pipeforge.tools import demo_models as models
from pipeforge.runtime.p2p import PipelineError
from pipeforge.runtime.stage import StageRunner


def runner(module, *, first=False, last=False):
    return StageRunner(module, stage=1, chain=0, is_first=first, is_last=last,
                       loss_fn=models.loss_fn if last else None)


def grads(module):
    return [p.grad.clone() for p in module.parameters()]


@pytest.mark.parametrize("model, first, last", [
    ("mlp", False, False), ("mlp", True, False), ("mlp", False, True),
    ("tuple", False, False), ("tuple", True, False), ("tuple", False, True),
])
def test_input_then_weight_equals_full_backward(model, first, last):
    stages = models.build_stages(model, 3, seed=1)
    index = 0 if first else (2 if last else 1)
    module_b, module_iw = stages[index], copy.deepcopy(stages[index])
    torch.manual_seed(0)
    widths = models.widths(3)
    hidden = torch.randn(4, widths[index], dtype=torch.float64)
    args = (hidden,) if first or model == "mlp" else (hidden, torch.randn(4, models.SKIP_WIDTH, dtype=torch.float64))
    target = torch.randn(4, widths[-1], dtype=torch.float64)
    by_b, by_iw = runner(module_b, first=first, last=last), runner(module_iw, first=first, last=last)
    out = by_b.forward(0, args, target, training=True)
    by_iw.forward(0, args, target, training=True)
    output_grads = None if last else tuple(torch.randn_like(t) for t in by_b.output_metas(0))
    want = by_b.backward(0, output_grads)
    got = by_iw.backward_input(0, output_grads)
    assert all(p.grad is None for p in module_iw.parameters()), "I must not touch the weights"
    by_iw.backward_weight(0)
    for g, w in zip(got, want):
        assert (g is None) == (w is None) and (g is None or torch.equal(g, w))
    for g, w in zip(grads(module_iw), grads(module_b)):
        assert torch.equal(g, w)
    assert not by_b.states and not by_iw.states
    assert out is not None


def test_weights_accumulate_across_microbatches():
    module = models.build_stages("mlp", 2, seed=0)[1]
    stage = runner(module, last=True)
    for mb in range(3):
        stage.forward(mb, (torch.randn(2, models.widths(2)[1], dtype=torch.float64),),
                      torch.randn(2, models.widths(2)[2], dtype=torch.float64), training=True)
    stage.backward_input(0, None)
    stage.backward_weight(0)
    after_one = grads(module)
    stage.backward(1, None)
    stage.backward_input(2, None)
    stage.backward_weight(2)
    assert all(not torch.equal(a, b) for a, b in zip(after_one, grads(module)))
    assert sorted(stage.losses) == [0, 1, 2]


def test_weight_before_input_is_an_error():
    stage = runner(models.build_stages("mlp", 2)[1], last=True)
    stage.forward(0, (torch.randn(2, models.widths(2)[1], dtype=torch.float64),),
                  torch.randn(2, models.widths(2)[2], dtype=torch.float64), training=True)
    with pytest.raises(PipelineError, match="before its I"):
        stage.backward_weight(0)


def test_backward_without_forward_is_an_error():
    with pytest.raises(PipelineError, match="without its forward"):
        runner(models.build_stages("mlp", 2)[1]).backward(3, None)


def test_eval_keeps_no_graph():
    stage = runner(models.build_stages("mlp", 2)[1], last=True)
    with torch.no_grad():
        stage.forward(0, (torch.randn(2, models.widths(2)[1], dtype=torch.float64),),
                      torch.randn(2, models.widths(2)[2], dtype=torch.float64), training=False)
    assert not stage.states and 0 in stage.losses and 0 in stage.outputs


def test_eval_without_a_target_computes_no_loss():
    stage = runner(models.build_stages("mlp", 2)[1], last=True)
    with torch.no_grad():
        out = stage.forward(0, (torch.randn(2, models.widths(2)[1], dtype=torch.float64),), None, training=False)
    assert not stage.losses and torch.equal(stage.outputs[0], out)


def test_loss_must_be_a_scalar():
    stage = StageRunner(models.build_stages("mlp", 1)[0], 0, 0, True, True, loss_fn=lambda out, target: out)
    with pytest.raises(PipelineError, match="scalar"):
        stage.forward(0, (torch.randn(2, models.widths(1)[0], dtype=torch.float64),), None, training=True)


class AddsFromSecondCall(torch.nn.Module):
    """A linear layer whose input is increased by one in place from its second call on."""

    def __init__(self):
        super().__init__()
        self.linear, self.calls = torch.nn.Linear(3, 3, dtype=torch.float64), 0

    def forward(self, x):
        self.calls += 1
        if self.calls > 1:
            x.add_(1.0)
        return self.linear(x)


def test_a_stage_that_starts_changing_its_input_in_place_is_told_and_given_copies_after():
    module = AddsFromSecondCall()
    stage = runner(module)
    x = torch.randn(2, 3, dtype=torch.float64)
    before = x.clone()
    stage.forward(0, (x,), None, True)
    assert stage.changes_inputs is False  # its first forward changed nothing: it is given its leaves
    with pytest.raises(PipelineError, match="changed in place an input that wants a gradient, which its first "
                                            "forward did not: from its next forward on it is given copies"):
        stage.forward(1, (x,), None, True)
    output = stage.forward(2, (x,), None, True)
    assert stage.changes_inputs is True
    torch.testing.assert_close(output, module.linear(x + 1.0), rtol=0, atol=0)
    assert torch.equal(x, before)  # what was received is untouched: the stage changed its copy
    (gradient,) = stage.backward(2, (torch.ones(2, 3, dtype=torch.float64),))
    torch.testing.assert_close(gradient, torch.ones(2, 3, dtype=torch.float64) @ module.linear.weight, rtol=0, atol=0)
