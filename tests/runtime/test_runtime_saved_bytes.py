"""The saved-tensor accounting (``runtime/saved.py``): what it counts once (a storage; a given input its own
bytes), that an I frees what its W does not need, and that a split backward leaves nothing saved behind under its hooks (a saved output held
as itself made a cycle through autograd that outlived W: 7,872 of a GPT stage's 12,936 bytes a
microbatch, every microbatch)."""

from __future__ import annotations

import gc

import torch

from pipeforge.runtime.saved import SavedBytes, counted, saved_key
from pipeforge.runtime.stage import StageRunner
from tests.zoo import models as zoo


def test_a_storage_counts_once_a_given_input_its_own_bytes():
    counter = SavedBytes()
    x = torch.zeros(4, 6, dtype=torch.float64)
    keys = [counter.add(t) for t in (x, x.t(), x.view(-1), x[1:], x[2:, 1])]
    assert counter.held == x.nbytes and counter.peak == counter.held  # views keep the storage alive: once
    assert saved_key(torch.zeros(0)) is None
    for key in keys:
        counter.drop(key)
    assert counter.held == 0 and counter.peak == x.nbytes
    batch = torch.zeros(6, 5, dtype=torch.float64)
    rows = batch.tensor_split(3)  # a microbatch's rows of the caller's batch: its own bytes, not the batch's
    counter.give(rows[1])
    keys = [counter.add(t) for t in (rows[1], rows[1][:, :2], rows[1].t())]
    assert counter.held == rows[1].nbytes
    counter.add(rows[2])  # not given: the storage it keeps alive
    assert counter.held == rows[1].nbytes + batch.nbytes


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
    assert 0 < counter.held < held / 2  # I frees what W does not need (the GPT stage: 0.42 of it)
    for mb in range(3):
        runner.backward_weight(mb)
    gc.collect()
    assert counter.held == 0


def test_input_pass_frees_exactly_what_the_weight_pass_does_not_read():
    """Linear, GELU, Linear: W reads the two linears' inputs; GELU's input (the first linear's output) goes at I."""
    module = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.GELU(), torch.nn.Linear(7, 5)).double()
    runner = StageRunner(module, 1, 0, False, False)
    counter = SavedBytes()
    with counted(counter, {p.untyped_storage().data_ptr() for p in module.parameters()}):
        runner.forward(0, (torch.randn(3, 5, dtype=torch.float64),), None, True)
    row = 8 * 3  # float64 bytes of one column of 3 rows
    assert counter.held == row * (5 + 7 + 7)  # x, GELU's input, the second linear's input
    runner.backward_input(0, (torch.ones(3, 5, dtype=torch.float64),))
    assert counter.held == row * (5 + 7)
    runner.backward_weight(0)
    gc.collect()
    assert counter.held == 0


def test_a_recomputed_forwards_outputs_are_flagged_as_the_first_carried_them():
    """``saved._flagged``: the outputs of a recomputed forward run without autograd become leaves that carry a
    gradient where its stage's first forward's did (complex ones too), never an integer tensor."""
    from pipeforge.runtime.saved import _carried, _flagged

    with torch.enable_grad():
        weight = torch.ones(3, dtype=torch.complex128, requires_grad=True)
        first = (torch.ones(3, dtype=torch.float64, requires_grad=True) * 2, weight * 2, torch.arange(3))
    carried = _carried(first)
    assert carried == (True, True, False)
    later = (torch.ones(3, dtype=torch.float64), torch.ones(3, dtype=torch.complex128), torch.arange(3))
    flags = [t.requires_grad for t in _flagged(later, carried)]
    assert flags == [True, True, False] and all(t.grad_fn is None for t in _flagged(first, carried))
    assert not _flagged(torch.arange(3), (True,)).requires_grad


def _checkpoint_held(model: str, stages: int, kwargs_of) -> tuple[int, int, int]:
    """What a middle stage of zoo ``model``'s recomputed forward keeps, as the runtime counts it (the bytes
    ``SavedActivations`` holds after the F) and as ``pipeforge profile`` measures it (its meter's
    ``checkpoint``), and the sum of the inputs' own sizes."""
    from pipeforge.runtime.saved import SavedActivations
    from pipeforge.tools.profiling import _Meter, _nbytes

    stage = zoo.build(model, stages)[1]
    _, _, shared = zoo.batch(model, 2, 0)
    args, kwargs = (torch.randn(2, zoo.SEQ, zoo.WIDTH, dtype=torch.float64),), kwargs_of(shared)
    saved = SavedActivations(frozenset({(1, 0, 0)}), frozenset(), None, count=True)
    saved.forward(StageRunner(stage, 1, 0, False, False), 0, args, None, True, kwargs)
    runner = StageRunner(stage, 1, 0, False, False)
    meter = _Meter(stage.parameters())
    meter.wrap(runner)
    meter.counting = True
    runner.forward(0, args, None, True, kwargs)
    return saved.counter.held, meter.checkpoints[-1], _nbytes((args, kwargs))


def test_profile_measures_a_checkpoint_as_the_runtime_holds_it():
    """``pipeforge profile``'s ``checkpoint`` is the runtime's count (``saved.count_checkpoint``, each storage
    once): the llama stage's positions given under two names are kept once; it summed their sizes (one more
    positions tensor), which simulate then predicted as held."""
    runtime, profiled, summed = _checkpoint_held("llama", 3, lambda shared: {**shared, "again": shared["positions"]})
    positions = zoo.batch("llama", 2, 0)[2]["positions"]
    assert runtime == profiled == summed - positions.nbytes
    runtime, profiled, summed = _checkpoint_held("gpt-dropout", 3, lambda shared: shared)  # the padding mask
    assert runtime == profiled == summed
