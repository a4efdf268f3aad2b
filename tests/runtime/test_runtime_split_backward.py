"""I then W equals one full backward, and W does not redo I's work."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from pipeforge.runtime.split_backward import SplitBackward, backward_input, backward_weight


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


# -- every layer type of the model zoo: I then W equals one full backward, bit for bit --------


class OnAndOffThePath(nn.Module):
    """One weight used on the inputs' path and on a branch the inputs never reach."""

    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(5, 5)

    def forward(self, x):
        return self.linear(x) + self.linear.weight.sum() * 2.0


class Frozen(nn.Module):
    """A frozen layer between two trained ones, and a buffer."""

    def __init__(self):
        super().__init__()
        self.a, self.frozen, self.b = nn.Linear(5, 5), nn.Linear(5, 5), nn.Linear(5, 5)
        self.frozen.requires_grad_(False)
        self.norm = nn.BatchNorm1d(5)

    def forward(self, x):
        return self.b(torch.tanh(self.frozen(self.norm(self.a(x)))))


class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.attention = nn.MultiheadAttention(8, 2, batch_first=True)

    def forward(self, x):
        return self.attention(x, x, x, need_weights=False)[0]


def zoo_layers():
    from tests.zoo import models as zoo

    rows, seq, width = 3, zoo.SEQ, zoo.WIDTH
    hidden = (rows, seq, width)
    gpt_kwargs = {"padding": torch.arange(seq) >= torch.tensor([[4], [2], [1]])}
    llama_kwargs = {"positions": torch.arange(seq) + torch.tensor([[0], [2], [1]])}
    return {
        "multihead-attention": (Attention, hidden, {}),
        "transformer-encoder-layer": (lambda: nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True),
                                      hidden, {}),
        "gpt-block": (zoo.GptBlock, hidden, gpt_kwargs),
        "llama-block": (zoo.LlamaBlock, hidden, llama_kwargs),
        "moe-block": (zoo.MoeBlock, hidden, {}),
        "moe-one-token": (zoo.TopTwoMoE, (1, 1, width), {}),  # two of four experts get no token
        "head": (zoo.Head, hidden, {}),
        "on-and-off-the-inputs-path": (OnAndOffThePath, (3, 5), {}),
        "frozen-and-buffers": (Frozen, (4, 5), {}),
        "tied-linear": (Tied, (3, 5), {}),
    }


def gradients(module, x, seeds, kwargs, split_backward):
    x = x.detach().requires_grad_()
    outs = as_outputs(module(x, **kwargs))
    params = [p for p in module.parameters() if p.requires_grad]
    if not split_backward:
        torch.autograd.backward(outs, seeds)
        return x.grad, [p.grad for p in params]
    (dx,), plan = backward_input(outs, seeds, [x], params)
    assert all(p.grad is None for p in params)
    grads = {id(p): g for p, g in backward_weight(plan)}
    return dx, [grads.get(id(p)) for p in params]


def same(got, want) -> bool:
    return (got is None and want is None) or (got is not None and want is not None and torch.equal(got, want))


@pytest.mark.parametrize("layer", sorted(zoo_layers()))
def test_every_zoo_layer_splits_bit_for_bit(layer):
    make, shape, kwargs = zoo_layers()[layer]
    torch.manual_seed(0)
    module = make().double()
    x = torch.randn(*shape, dtype=torch.float64)
    seeds = tuple(torch.randn_like(o) for o in as_outputs(module(x, **kwargs)))
    want_dx, want = gradients(module, x, seeds, kwargs, split_backward=False)
    module.zero_grad(set_to_none=True)
    got_dx, got = gradients(module, x, seeds, kwargs, split_backward=True)
    assert torch.equal(got_dx, want_dx)
    assert all(same(g, w) for g, w in zip(got, want)), [
        name for (name, p), g, w in zip(module.named_parameters(), got, want) if not same(g, w)]
    if layer == "moe-one-token":
        assert sum(g is None for g in got) == 2 * 3  # two unused experts, three weights each


def test_the_first_stage_splits_an_embedding_with_integer_inputs():
    from tests.zoo import models as zoo

    stage = zoo.build("tied", 2)[0]
    tokens, _, kwargs = zoo.batch("tied", 3, 0)
    out = stage(tokens, **kwargs)
    seed = torch.randn_like(out)
    out.backward(seed)
    want = [p.grad.clone() for p in stage.parameters()]
    stage.zero_grad(set_to_none=True)
    out = stage(tokens, **kwargs)
    found, plan = backward_input((out,), (seed,), [], list(stage.parameters()))
    got = {id(p): g for p, g in backward_weight(plan)}
    assert found == () and all(torch.equal(got[id(p)], w) for p, w in zip(stage.parameters(), want))


def test_weights_of_one_shape_are_told_apart_by_identity():
    """Two weights equal in value and shape stay two weights (groups were compared by value)."""
    layers = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4)).double()
    with torch.no_grad():
        layers[1].weight.copy_(layers[0].weight)
        layers[1].bias.copy_(layers[0].bias)
    x = torch.randn(2, 4, dtype=torch.float64, requires_grad=True)
    out = layers(x)
    _, plan = backward_input((out,), (torch.ones_like(out),), [x], list(layers.parameters()))
    grads = backward_weight(plan)
    assert len(grads) == 4 and len({id(p) for p, _ in grads}) == 4


# -- one SplitBackward kept across microbatches (as each stage keeps one): what it reuses stays exact --


def split_with(split, module, x, seeds, kwargs=None):
    x = x.detach().requires_grad_()
    outs = as_outputs(module(x, **(kwargs or {})))
    params = [p for p in module.parameters() if p.requires_grad]
    (dx,), plan = split.backward_input(outs, seeds, [x], params)
    assert all(p.grad is None for p in params)
    grads = {id(p): g for p, g in backward_weight(plan)}
    return dx, [grads.get(id(p)) for p in params]


def full_with(module, x, seeds, kwargs=None):
    x = x.detach().requires_grad_()
    torch.autograd.backward(as_outputs(module(x, **(kwargs or {}))), seeds)
    grads = [p.grad for p in module.parameters() if p.requires_grad]
    module.zero_grad(set_to_none=True)
    return x.grad, grads


def assert_split_exact(split, module, x, kwargs=None):
    seeds = tuple(torch.randn_like(o) for o in as_outputs(module(x, **(kwargs or {}))))
    want_dx, want = full_with(module, x, seeds, kwargs)
    got_dx, got = split_with(split, module, x, seeds, kwargs)
    assert torch.equal(got_dx, want_dx)
    assert len(got) == len(want) and all(same(g, w) for g, w in zip(got, want))


def test_a_repeated_graph_is_analysed_once():
    from tests.zoo import models as zoo

    torch.manual_seed(0)
    block, split = zoo.GptBlock().double(), SplitBackward()
    for seed in range(4):
        torch.manual_seed(seed)
        assert_split_exact(split, block, torch.randn(3, zoo.SEQ, zoo.WIDTH, dtype=torch.float64))
    assert split.analysed == 1


def test_moe_routing_to_other_experts_between_microbatches_stays_exact():
    """Each microbatch reaches other experts (another graph shape): analysed afresh, never a stale layout."""
    from tests.zoo import models as zoo

    torch.manual_seed(0)
    moe, split = zoo.TopTwoMoE().double(), SplitBackward()
    shapes = set()
    for seed in [0, 1, 2, 0, 3, 1, 4, 5]:  # some routings come back: their layout is reused
        torch.manual_seed(seed)
        x = torch.randn(1, 1 + seed % 2, zoo.WIDTH, dtype=torch.float64)
        assert_split_exact(split, moe, x)
        with torch.no_grad():
            shapes.add(frozenset(moe.router(x.reshape(-1, zoo.WIDTH)).topk(2, dim=-1).indices.flatten().tolist()))
    assert split.analysed == len(shapes) > 1  # one graph shape for each set of experts reached


class Swapped(nn.Module):
    """The same graph shape, but which weight sits where depends on the call."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(5, 5), nn.Linear(5, 5)

    def forward(self, x, flip=False):
        first, second = (self.b, self.a) if flip else (self.a, self.b)
        return second(torch.tanh(first(x)))


def test_the_same_shape_with_weights_in_other_places_is_analysed_again():
    torch.manual_seed(0)
    module, split = Swapped().double(), SplitBackward()
    x = torch.randn(3, 5, dtype=torch.float64)
    for flip in (False, True, False, True):
        assert_split_exact(split, module, x, {"flip": flip})
    assert split.analysed == 2


def test_a_replaced_or_retyped_parameter_is_not_taken_for_the_old_one():
    torch.manual_seed(0)
    module, split = nn.Sequential(nn.Linear(5, 5), nn.Tanh(), nn.Linear(5, 5)), SplitBackward()
    assert_split_exact(split, module, torch.randn(3, 5))
    module.double()  # every weight's .data swapped for float64: each gets a new accumulator
    x = torch.randn(3, 5, dtype=torch.float64)
    assert_split_exact(split, module, x)
    module[0].weight = nn.Parameter(module[0].weight.detach().clone())  # a new weight object in the same place
    assert_split_exact(split, module, x)
    module[2].requires_grad_(False)  # frozen between microbatches
    assert_split_exact(split, module, x)
    module[2].requires_grad_(True)
    assert_split_exact(split, module, x)


ROUTE = st.lists(st.tuples(st.sampled_from(["chain", "residual", "off-path", "twice"]), st.integers(0, 2)),
                 min_size=1, max_size=5)


class Routed(nn.Module):
    """Three linear layers used along a route drawn per microbatch: chained, residual, off the inputs' path
    (only its weight's sum reaches the output), or twice in a row."""

    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(4, 4) for _ in range(3))

    def forward(self, x, route=()):
        for kind, index in route:
            layer = self.layers[index]
            if kind == "chain":
                x = torch.tanh(layer(x))
            elif kind == "residual":
                x = x + layer(x)
            elif kind == "off-path":
                x = x * layer.weight.sum()
            else:
                x = layer(torch.sin(layer(x)))
        return x


@settings(max_examples=40, deadline=None)
@given(routes=st.lists(ROUTE, min_size=1, max_size=4), repeat=st.booleans())
def test_any_sequence_of_routes_through_one_kept_split_is_exact(routes, repeat):
    torch.manual_seed(0)
    module, split = Routed().double(), SplitBackward()
    x = torch.randn(2, 4, dtype=torch.float64)
    for route in routes + (routes if repeat else []):
        assert_split_exact(split, module, x, {"route": route})
    assert split.analysed <= len({tuple(r) for r in routes})


# -- what I frees, and what it cannot --------------------------------------------------------------


class WritesIntoAView(nn.Module):
    """An in-place write into a slice: a CopySlices node holds the write's saved tensors out of reach."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(5, 5), nn.Linear(5, 5)

    def forward(self, x):
        h = self.a(x).clone()
        h[:, :2] = torch.tanh(h[:, :2]) * 2.0
        return self.b(h)


class Checkpointed(nn.Module):
    """Non-reentrant activation checkpointing: its saved tensors are under checkpoint's own hooks."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(5, 5), nn.Linear(5, 5)

    def forward(self, x):
        from torch.utils.checkpoint import checkpoint

        return self.b(checkpoint(lambda t: torch.tanh(self.a(t)) * t, x, use_reentrant=False))


@pytest.mark.parametrize("make, kept", [(WritesIntoAView, "CopySlices"), (Checkpointed, "kept until W")])
def test_what_input_pass_cannot_free_it_keeps_and_names(make, kept):
    torch.manual_seed(0)
    module = make().double()
    x = torch.randn(3, 5, dtype=torch.float64)
    seeds = (torch.randn(3, 5, dtype=torch.float64),)
    want_dx, want = gradients(module, x, seeds, {}, split_backward=False)
    module.zero_grad(set_to_none=True)
    got_dx, got, plan = split(module, x, seeds)
    assert kept in plan.note
    assert torch.equal(got_dx, want_dx) and all(same(g, w) for g, w in zip(got, want))


def test_a_plain_stage_frees_everything_and_says_nothing():
    torch.manual_seed(0)
    module = nn.Sequential(nn.Linear(5, 7), nn.GELU(), nn.Linear(7, 5)).double()
    x = torch.randn(3, 5, dtype=torch.float64)
    _, _, plan = split(module, x, (torch.randn(3, 5, dtype=torch.float64),))
    assert plan.note == ""


def test_weight_pass_calls_the_engine_once_for_groups_that_do_not_reach_each_other():
    """A top-2 MoE's experts sit side by side: their groups share calls; a chain of layers cannot."""
    from tests.zoo import models as zoo

    torch.manual_seed(0)
    moe, chain = zoo.MoeBlock().double(), nn.Sequential(nn.Linear(5, 5), nn.Tanh(), nn.Linear(5, 5)).double()
    for module, x, fewer in ((moe, torch.randn(3, zoo.SEQ, zoo.WIDTH, dtype=torch.float64), True),
                             (chain, torch.randn(3, 5, dtype=torch.float64), False)):
        seeds = (torch.randn_like(module(x)),)
        want_dx, want = gradients(module, x, seeds, {}, split_backward=False)
        module.zero_grad(set_to_none=True)
        got_dx, got, plan = split(module, x, seeds)
        assert (len(plan.calls) < len(plan.groups)) == fewer
        assert sorted(g for call in plan.calls for g in call) == list(range(len(plan.groups)))
        assert torch.equal(got_dx, want_dx) and all(same(g, w) for g, w in zip(got, want))
