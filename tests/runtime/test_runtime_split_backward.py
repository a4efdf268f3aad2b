"""I then W equals one full backward, and W does not redo I's work."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from pipeforge.runtime.split_backward import backward_input, backward_weight


class Tied(nn.Module):
    """One linear layer applied twice: one weight, two frontier nodes."""

    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(5, 5)

    def forward(self, x):
        return self.linear(torch.tanh(self.linear(x)))


class Detached(nn.Module):
    """A second output that the input never reaches: its weight starts at the outputs."""

    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(5, 5)
        self.bias_only = nn.Parameter(torch.ones(5, dtype=torch.float64))

    def forward(self, x):
        return self.linear(x), self.bias_only * 3.0


class Residual(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(5, 5), nn.Linear(5, 5)

    def forward(self, x):
        h = torch.tanh(self.a(x)) + x
        return self.b(h) * h


def as_outputs(value):
    return value if isinstance(value, tuple) else (value,)


def full_backward(module, x, seeds):
    x = x.detach().requires_grad_()
    outs = as_outputs(module(x))
    torch.autograd.backward(outs, seeds)
    return x.grad, [p.grad.clone() for p in module.parameters()]


def split(module, x, seeds):
    x = x.detach().requires_grad_()
    outs = as_outputs(module(x))
    params = list(module.parameters())
    (dx,), plan = backward_input(outs, seeds, [x], params)
    assert all(p.grad is None for p in params)
    grads = dict((id(p), g) for p, g in backward_weight(plan))
    return dx, [grads[id(p)] for p in params], plan


@pytest.mark.parametrize("make, frontier_groups, from_outputs", [
    (lambda: nn.Sequential(nn.Linear(5, 7), nn.Tanh(), nn.Linear(7, 5)), 2, 0),
    (Tied, 1, 0),
    (Detached, 1, 1),
    (Residual, 2, 0),
])
def test_split_equals_full_backward(make, frontier_groups, from_outputs):
    torch.manual_seed(0)
    module = make().double()
    x = torch.randn(3, 5, dtype=torch.float64)
    seeds = tuple(torch.randn_like(o) for o in as_outputs(module(x)))
    want_dx, want = full_backward(module, x, seeds)
    module.zero_grad(set_to_none=True)
    got_dx, got, plan = split(module, x, seeds)
    assert torch.allclose(got_dx, want_dx, rtol=1e-12, atol=1e-14)
    for g, w in zip(got, want):
        assert torch.allclose(g, w, rtol=1e-12, atol=1e-14)
    assert len(plan.groups) == frontier_groups and len(plan.from_outputs) == from_outputs


def test_without_inputs_every_weight_starts_at_the_outputs():
    module = nn.Linear(4, 2).double()
    out = module(torch.randn(3, 4, dtype=torch.float64))
    found, plan = backward_input((out,), (torch.ones_like(out),), [], list(module.parameters()))
    assert found == () and not plan.groups and len(plan.from_outputs) == 2
    grads = backward_weight(plan)
    assert all(g is not None for _, g in grads)


def test_weight_pass_runs_no_input_gradient_kernels():
    """W of a linear chain computes weight products only: count matmuls with a dispatch mode."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class CountMatmuls(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.count = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func.__name__.startswith(("mm", "addmm")):
                self.count += 1
            return func(*args, **(kwargs or {}))

    layers = nn.Sequential(*[nn.Linear(6, 6, bias=False) for _ in range(4)]).double()
    x = torch.randn(2, 6, dtype=torch.float64, requires_grad=True)
    out = layers(x)
    _, plan = backward_input((out,), (torch.ones_like(out),), [x], list(layers.parameters()))
    with CountMatmuls() as counter:
        backward_weight(plan)
    assert counter.count == 4  # one dW product per layer, no dX products
