"""Regions compiled with ``split_backend``: I runs their input-gradient graphs, W their weight-gradient graphs.

The backward is the runtime's own (``SplitBackward`` for I and W, ``autograd.backward`` for B) on
stage modules whose blocks are compiled one by one; the inner backend is ``aot_eager``
(bit for bit the eager gradients in float64), counted to see which graph each pass runs, and
inductor once (float32 and float64 within rounding).
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from pipeforge.models.compiled import split_backend
from pipeforge.runtime.split_backward import (
    FUSED_NOTE,
    REGION_NODE,
    SPLIT_NOTE,
    SplitBackward,
    accumulate_weight_gradients,
)

GRAPHS = ("forward", "input", "weight")  # the order trace_region compiles a region's graphs in


class Counted:
    """``aot_eager``, recording the kind of every graph run (a region's graphs are compiled in GRAPHS' order)."""

    def __init__(self) -> None:
        self.compiled, self.ran = 0, []

    def __call__(self, gm, example_inputs):
        run = torch._dynamo.lookup_backend("aot_eager")(gm, example_inputs)
        kind = GRAPHS[self.compiled % 3]
        self.compiled += 1

        def counted(*args):
            self.ran.append(kind)
            return run(*args)

        return counted

    def take(self) -> list[str]:
        ran, self.ran = self.ran, []
        return ran


class Block(nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.norm, self.up, self.down = nn.LayerNorm(width), nn.Linear(width, 2 * width), nn.Linear(2 * width, width)

    def forward(self, x):
        return x + self.down(torch.tanh(self.up(self.norm(x))))


class Stage(nn.Module):
    def __init__(self, width: int = 4, blocks: int = 2):
        super().__init__()
        self.pre = nn.Linear(width, width)
        self.blocks = nn.ModuleList(Block(width) for _ in range(blocks))
        self.post = nn.Linear(width, width)

    def forward(self, x):
        x = self.pre(x)
        for block in self.blocks:
            x = block(x)
        return self.post(x)


def compiled_copy(stage: Stage, backend) -> Stage:
    """Every block compiled in place, the torchtitan way (names of parameters unchanged)."""
    mine = copy.deepcopy(stage)
    for block in mine.blocks:
        block.compile(backend=split_backend(backend), dynamic=False)
    return mine


@pytest.fixture
def float64():
    before = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(before)


def eager_gradients(stage: Stage, x: torch.Tensor, grad: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
    x = x.detach().requires_grad_()
    stage(x).backward(grad)
    return x.grad, [p.grad for p in stage.parameters()]


def test_i_runs_the_input_graphs_and_w_the_weight_graphs_giving_the_eager_gradients(float64):
    torch.manual_seed(0)
    eager, counted = Stage(), Counted()
    mine = compiled_copy(eager, counted)
    x, grad = torch.randn(8, 4, requires_grad=True), torch.randn(8, 4)
    out = mine(x)
    assert type(out.grad_fn.next_functions[0][0]).__name__ != REGION_NODE  # post is eager
    assert counted.take() == ["forward", "forward"]
    params = list(mine.parameters())
    (dx,), plan = SplitBackward().backward_input((out,), (grad,), [x], params)
    assert counted.take() == ["input", "input"] and plan.note == SPLIT_NOTE
    assert all(p.grad is None for p in params)
    accumulate_weight_gradients(plan)
    assert counted.take() == ["weight", "weight"]
    want_dx, want = eager_gradients(eager, x, grad)
    assert torch.equal(dx, want_dx)
    assert all(torch.equal(p.grad, w) for p, w in zip(params, want))


def test_a_full_backward_runs_both_graphs_once(float64):
    torch.manual_seed(1)
    eager, counted = Stage(blocks=1), Counted()
    mine = compiled_copy(eager, counted)
    x, grad = torch.randn(8, 4, requires_grad=True), torch.randn(8, 4)
    mine(x).backward(grad)
    assert counted.take() == ["forward", "input", "weight"]
    want_dx, want = eager_gradients(eager, x, grad)
    assert torch.equal(x.grad, want_dx)
    assert all(torch.equal(p.grad, w) for p, w in zip(mine.parameters(), want))


class Outputs(nn.Module):
    """Several outputs (one unused, one integer), a frozen weight, and an input that needs no gradient."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(4, 4), nn.Linear(4, 4)
        self.b.weight.requires_grad_(False)

    def forward(self, x, scale):
        h = self.a(x) * scale
        return self.b(h), h.sum(-1), (h > 0).sum()


def test_unused_outputs_integer_outputs_and_frozen_weights(float64):
    torch.manual_seed(2)
    eager = Outputs()
    mine = torch.compile(copy.deepcopy(eager), backend=split_backend("aot_eager"), dynamic=False)
    x, scale, grad = torch.randn(8, 4, requires_grad=True), torch.randn(8, 1), torch.randn(8, 4)
    leaf = x.detach().requires_grad_()
    got, want = mine(x, scale), eager(leaf, scale)
    assert torch.equal(got[2], want[2]) and not got[2].requires_grad
    params = [p for p in mine.parameters() if p.requires_grad]
    (dx,), plan = SplitBackward().backward_input((got[0],), (grad,), [x], params)  # got[1] unused
    accumulate_weight_gradients(plan)
    want[0].backward(grad)
    assert torch.equal(dx, leaf.grad) and mine.b.weight.grad is None
    assert torch.equal(mine.a.weight.grad, eager.a.weight.grad) and torch.equal(mine.b.bias.grad, eager.b.bias.grad)


def test_a_region_that_writes_into_a_buffer_is_compiled_plainly(float64):
    torch.manual_seed(4)
    eager = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4), nn.Linear(4, 4))
    mine = torch.compile(copy.deepcopy(eager), backend=split_backend("aot_eager"), dynamic=False)
    x, grad = torch.randn(8, 4, requires_grad=True), torch.randn(8, 4)
    out = mine(x)
    (dx,), plan = SplitBackward().backward_input((out,), (grad,), [x], list(mine.parameters()))
    accumulate_weight_gradients(plan)
    assert plan.note == FUSED_NOTE  # one fused node, as a plain compile gives
    want_dx, want = eager_gradients(eager, x, grad)
    assert torch.equal(dx, want_dx) and all(torch.equal(p.grad, w) for p, w in zip(mine.parameters(), want))
    assert torch.equal(mine._orig_mod[1].running_mean, eager[1].running_mean)  # updated once each


class WritesInPlace(nn.Module):
    """Writes into its own values (``div_``, ``add_`` on intermediates, as Falcon's attention does)."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(4, 8), nn.Linear(8, 4)

    def forward(self, x):
        h = self.a(x)
        h.div_(2.0)
        h = torch.tanh(h) * 3.0
        h.add_(1.0)
        return self.b(h)


def test_a_region_that_writes_into_its_own_values_still_splits(float64):
    torch.manual_seed(5)
    eager, counted = WritesInPlace(), Counted()
    mine = torch.compile(copy.deepcopy(eager), backend=split_backend(counted), dynamic=False)
    x, grad = torch.randn(8, 4, requires_grad=True), torch.randn(8, 4)
    out = mine(x)
    params = list(mine.parameters())
    (dx,), plan = SplitBackward().backward_input((out,), (grad,), [x], params)
    assert plan.note == SPLIT_NOTE and all(p.grad is None for p in params)  # fused before: FUSED_NOTE
    accumulate_weight_gradients(plan)
    assert counted.take() == ["forward", "input", "weight"]
    want_dx, want = eager_gradients(eager, x, grad)
    assert torch.equal(dx, want_dx) and all(torch.equal(p.grad, w) for p, w in zip(params, want))


def test_without_gradients_the_plain_compiled_graph_runs(float64):
    counted = Counted()
    mine = compiled_copy(Stage(blocks=1), counted)
    with torch.no_grad():
        out = mine(torch.randn(8, 4))
    assert out.grad_fn is None and counted.take() == ["forward"] and counted.compiled == 1


@pytest.mark.parametrize("dtype,tolerance", [(torch.float32, 1e-5), (torch.float64, 1e-12)])
def test_inductor_regions_split_within_rounding(dtype, tolerance):
    torch.manual_seed(3)
    eager = Stage(width=8, blocks=1).to(dtype)
    mine = compiled_copy(eager, "inductor")
    x, grad = torch.randn(8, 8, dtype=dtype, requires_grad=True), torch.randn(8, 8, dtype=dtype)
    out = mine(x)
    params = list(mine.parameters())
    (dx,), plan = SplitBackward().backward_input((out,), (grad,), [x], params)
    assert plan.note == SPLIT_NOTE and all(p.grad is None for p in params)
    accumulate_weight_gradients(plan)
    want_dx, want = eager_gradients(eager, x, grad)
    assert torch.allclose(dx, want_dx, rtol=tolerance, atol=tolerance)
    assert all(torch.allclose(p.grad, w, rtol=tolerance, atol=tolerance) for p, w in zip(params, want))
