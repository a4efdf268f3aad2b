"""What a split backward holds from a microbatch's I to its W, measured against what it reports.

Every storage made in the F and the I is tracked by weak reference (a dispatch mode); after the I, those
still alive (the parameters, and the stage's output and unsaved input aside: held from F to the
backward by the stage whichever way it runs) are what the I leaves for the W. The runtime's count of them (the saved
tensors W reads and, ``hold_gradients``, the gradients the plan holds: what ``Pipeline.saved_peak`` and
``pipeforge profile``'s ``weight_grad`` count) is that to the byte; the saved tensors alone were 0.45-0.5.
"""

from __future__ import annotations

import copy
import gc

import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from pipeforge.runtime.saved import SavedActivations, SavedBytes, counted, hold_gradients, saved_key
from pipeforge.runtime.stage import StageRunner
from tests.zoo import models as zoo


class Storages(TorchDispatchMode):
    """The storage of every tensor an operation makes, by weak reference."""

    def __init__(self) -> None:
        super().__init__()
        self.made: list[tuple[StorageWeakRef, int, int]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr():
                storage = t.untyped_storage()
                self.made.append((StorageWeakRef(storage), storage.data_ptr(), storage.nbytes()))
        return out

    def alive(self, besides: set[int]) -> int:
        gc.collect()
        found = {at: n for ref, at, n in self.made if not ref.expired() and at not in besides}
        return sum(found.values())


def _held(module: torch.nn.Module, x: torch.Tensor, last: bool, target=None, kwargs=None):
    """(bytes alive from I to W, the saved tensors' count, the count with the held gradients)."""
    runner = StageRunner(module, 1, 0, False, last, zoo.loss_fn if last else None)
    params = {p.untyped_storage().data_ptr() for p in module.parameters()}
    counter, tracker = SavedBytes(), Storages()
    with tracker:  # copies made under the tracker: what only the graph keeps of them is seen
        x = x.clone()
        kwargs = {k: v.clone() for k, v in (kwargs or {}).items()}
    with tracker, counted(counter, params):
        output = runner.forward(0, (x,), target, True, kwargs)
    del kwargs
    with tracker:
        grads = None if last else (torch.randn_like(output),)
        runner.backward_input(0, grads)
    del grads
    saved = counter.held
    hold_gradients(counter, runner.weight_plan(0))
    # the output, and a last stage's loss: kept by the stage from F on whichever way it runs
    besides = params | {t.untyped_storage().data_ptr() for t in (output, *runner.outputs.values(), *runner.losses.values())}
    if saved_key(x) not in counter._refs:  # the stage holds its input anyway; counted where autograd saved it
        besides.add(x.untyped_storage().data_ptr())
    return tracker.alive(besides), saved, counter.held, runner


def test_an_mlp_reports_what_it_holds_from_i_to_w():
    torch.manual_seed(0)
    module = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.GELU(), torch.nn.Linear(64, 16)).double()
    measured, saved, reported, runner = _held(module, torch.randn(8, 16, dtype=torch.float64).requires_grad_(), False)
    assert reported == measured
    assert saved <= 0.6 * measured  # the saved tensors alone: the two linears' inputs, not the gradients at them


def test_a_transformer_block_reports_what_it_holds_from_i_to_w():
    for stage, last in ((1, False), (2, True)):
        stages = zoo.build("gpt-dropout", 3)
        tokens, targets, kwargs = zoo.batch("gpt-dropout", 4, 0)
        with torch.no_grad():
            hidden = stages[0](tokens, **kwargs)
        torch.manual_seed(1)
        measured, saved, reported, _ = _held(stages[stage], hidden.requires_grad_(), last,
                                             targets if last else None, kwargs)
        assert reported == measured, (stage, reported, measured)
        assert saved <= 0.6 * measured, (stage, saved, measured)


def test_the_held_gradients_are_counted_from_i_until_w():
    module = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.GELU(), torch.nn.Linear(7, 5)).double()
    runner = StageRunner(module, 1, 0, False, False)
    saved = SavedActivations(frozenset(), frozenset(), None, count=True)
    assert saved.counter is not None
    with saved._hooks(runner, None):
        runner.forward(0, (torch.randn(3, 5, dtype=torch.float64).requires_grad_(),), None, True)
    runner.backward_input(0, (torch.ones(3, 5, dtype=torch.float64),))
    row = 8 * 3  # float64 bytes of one column of 3 rows
    assert saved.counter.held == row * (5 + 7)  # the two linears' inputs
    saved.input_done((0, 0, 0), runner.weight_plan(0))
    assert saved.counter.held == row * (5 + 7 + 5 + 7)  # and the gradients at their outputs (the first: the root's)
    runner.backward_weight(0)
    saved.backward_done((0, 0, 0))
    gc.collect()
    assert saved.counter.held == 0


def test_a_split_region_counts_the_gradients_it_keeps_for_w():
    """A region compiled with ``split_backend`` keeps, from I to W, the gradients its weight graph reads
    (``SplitRegion``'s ``kept``): the same bytes as the eager module's plan holds at its frontier."""
    from pipeforge.models.compiled import split_backend

    torch.manual_seed(0)
    eager = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.GELU(), torch.nn.Linear(64, 16)).double()
    region = torch.compile(copy.deepcopy(eager), backend=split_backend("aot_eager"), dynamic=False)
    held = []
    for module in (eager, region):
        runner = StageRunner(module, 1, 0, False, False)
        runner.forward(0, (torch.randn(8, 16, dtype=torch.float64).requires_grad_(),), None, True)
        runner.backward_input(0, (torch.ones(8, 16, dtype=torch.float64),))
        counter = SavedBytes()
        hold_gradients(counter, runner.weight_plan(0))
        held.append(counter.held)
        runner.backward_weight(0)
    assert held[0] == held[1] == 8 * 8 * (16 + 64)  # the root's gradient and the one at the first linear's output
