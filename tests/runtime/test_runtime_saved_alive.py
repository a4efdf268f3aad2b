"""What a forward's saved tensors keep alive, measured against what ``SavedBytes`` counts for them.

Every storage made in the forward is tracked by weak reference (``test_runtime_held_bytes.Storages``);
after it, those still alive (the parameters and the output aside; the inputs too where nothing saved
them) are what the saved tensors keep. A view keeps its whole storage alive: one chunk of
``nn.TransformerEncoderLayer``'s packed q, k, v projection saved alone (its math attention, under dropout)
keeps all three, and a tensor saved beside a slice of itself is one storage. Counting each tensor's own
bytes read 0.90-0.91 of the truth on the encoder layer and the Llama, and above it where slices overlap;
the count by storage (``saved_key``) is the truth to the byte. A recomputed forward, run under autograd
saving nothing, keeps only its output alive; a recomputed stage that changes an input in place only at a
later forward is refused by name.
"""

from __future__ import annotations

import gc

import pytest
import torch

from pipeforge.runtime.saved import SavedBytes, counted
from tests.models import families
from tests.runtime.test_runtime_held_bytes import Storages


def _saved_and_alive(module: torch.nn.Module, args: tuple, kwargs: dict) -> tuple[int, int]:
    """(the bytes ``SavedBytes`` counts after one forward, the bytes alive that only the graph keeps)."""
    params = {p.untyped_storage().data_ptr() for p in module.parameters()}
    params |= {b.untyped_storage().data_ptr() for b in module.buffers()}
    counter, tracker = SavedBytes(), Storages()
    with tracker:  # the inputs made under the tracker, each its own storage (as a received tensor is)
        args = tuple(a.clone().requires_grad_(a.is_floating_point()) for a in args)
        kwargs = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}
    with tracker, counted(counter, params, None, (args, kwargs)):
        output = module(*args, **kwargs)
    logits = output.logits if hasattr(output, "logits") else output
    besides = params | {logits.untyped_storage().data_ptr()}
    counted_at = {address for address, _ in counter._refs}
    for given in (*args, *[v for v in kwargs.values() if isinstance(v, torch.Tensor)]):  # held by the caller; counted (and alive for it) only if saved
        if given.data_ptr() not in counted_at:
            besides.add(given.untyped_storage().data_ptr())
    measured = tracker.alive(besides)
    held = counter.held
    del output, logits
    gc.collect()
    assert counter.held == 0  # the graph gone, nothing counted
    return held, measured


@pytest.mark.parametrize("norm_first", [True, False])
@pytest.mark.parametrize("batch_first", [True, False])
def test_a_transformer_encoder_layer_counts_what_its_saved_views_keep_alive(norm_first, batch_first):
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(16, 4, 32, dropout=0.1, batch_first=batch_first,
                                             norm_first=norm_first).double()
    held, measured = _saved_and_alive(layer, (torch.randn(3, 5, 16, dtype=torch.float64),), {})
    assert held == measured


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_a_hugging_face_model_counts_what_its_saved_tensors_keep_alive(family):
    model = families.build(family, layers=2)
    tokens, mask, _ = families.batch(family, 3, 0)
    held, measured = _saved_and_alive(model, (tokens,), {"attention_mask": mask, "use_cache": False})
    assert held == measured


class _Overlapping(torch.nn.Module):
    """Saves a tensor (exp's output) and a slice of it (sin's input): one storage."""

    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(6, 6)

    def forward(self, x):
        a = self.linear(x).exp()
        return a[:, :2].sin().sum(1) + a.sum(1)


def test_a_tensor_saved_beside_a_slice_of_itself_is_one_storage():
    module = _Overlapping().double()
    held, measured = _saved_and_alive(module, (torch.randn(4, 6, dtype=torch.float64),), {})
    assert held == measured == 4 * 6 * 8 * 2  # the linear's input and exp's output, the slice within it


def test_a_recomputed_forward_keeps_nothing_alive_but_its_output_and_tells_which_carry_a_gradient():
    """A recomputed F runs under autograd saving nothing: what stays alive is its output (and its inputs),
    and each output tensor says whether R's will carry a gradient (the table below: no)."""
    from pipeforge.runtime.saved import SavedActivations
    from pipeforge.runtime.stage import StageRunner

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.TransformerEncoderLayer(16, 4, 32, dropout=0.1, batch_first=True).double()

        def forward(self, x):
            return self.layer(x), torch.ones_like(x) * 0.5

    torch.manual_seed(0)
    module = Block()
    runner = StageRunner(module, 1, 0, False, False)
    saved = SavedActivations(frozenset({(1, 0, 0), (1, 1, 0)}), frozenset(), None)
    params = {p.untyped_storage().data_ptr() for p in module.parameters()}
    tracker = Storages()
    with tracker:
        x = torch.randn(3, 5, 16, dtype=torch.float64)
    with tracker:
        hidden, table = saved.forward(runner, 0, (x,), None, True, {}, (True,))
    assert hidden.requires_grad and hidden.grad_fn is None and not table.requires_grad
    outputs = {t.untyped_storage().data_ptr() for t in (hidden, table)}
    assert tracker.alive(params | outputs | {x.untyped_storage().data_ptr()}) == 0
    saved.recompute(runner, 0)  # R: the graph, saved tensors and all
    assert runner.states[0].roots and runner.states[0].roots[0].requires_grad
    with tracker:  # the stage's next forward of the step runs without autograd and says what the first learned
        hidden, table = saved.forward(runner, 1, (x.clone(),), None, True, {}, (True,))
    assert hidden.requires_grad and hidden.grad_fn is None and not table.requires_grad


def test_a_recomputed_stage_changing_an_input_in_place_later_only_is_refused_by_name():
    from pipeforge.runtime.p2p import PipelineError
    from pipeforge.runtime.saved import SavedActivations
    from pipeforge.runtime.stage import StageRunner

    class Sometimes(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(4, 4).double()

        def forward(self, h, table):
            if table.sum() < 0:
                table.add_(1.0)
            return self.linear(h) * table

    runner = StageRunner(Sometimes(), 1, 0, False, False, rank=1)
    saved = SavedActivations(frozenset({(1, 0, 0), (1, 1, 0), (1, 2, 0)}), frozenset(), None)
    h = torch.randn(2, 4, dtype=torch.float64)
    table = torch.ones(2, 4, dtype=torch.float64)
    saved.forward(runner, 0, (h, -table), None, True, {}, (True, False))  # changes it: copied from now on
    assert saved.changed[(1, 0)] == {1}
    assert torch.equal(saved.checkpoints[(1, 0, 0)].args[1], -table)  # R starts from what F started from
    other = StageRunner(Sometimes(), 2, 0, False, False, rank=1)
    saved.recomputed = frozenset({(2, 0, 0), (2, 1, 0)})
    saved.forward(other, 0, (h, table), None, True, {}, (True, False))  # unchanged at the first
    with pytest.raises(PipelineError, match=r"rank 1: stage 2 is recomputed and its forward of microbatch 1 "
                                            r"changed argument 1 in place, which its first recomputed forward did not"):
        saved.forward(other, 1, (h, -table), None, True, {}, (True, False))
