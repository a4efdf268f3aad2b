"""What R, OFFLOAD and RELOAD run: recomputation and offloading of one microbatch's saved activations.

Codegen writes which (stage, microbatch, chain) a schedule recomputes and offloads into ``ScheduleInfo``.
A recomputed forward's outputs carry a gradient where R's will (learned by the stage's first of a step,
run under autograd saving nothing); it keeps its inputs (a copy of those it changes in place) and RNG
state; R restores that state in a fork of the RNG (dropout draws the same masks) and runs the forward
again under autograd. An offloaded forward saves through ``saved_tensors_hooks`` into a holder; OFFLOAD
copies each saved non-parameter tensor to host memory, RELOAD back, one code path on the rank's copy lane
(``copy_lane.py``: CUDA, non-blocking on a side stream, waited before the backward; CPU, a host copy at
once). ``SavedBytes`` counts the bytes
saved tensors keep alive on the device (each storage once, a given input its own bytes: ``saved_key``), of
recomputed forwards' checkpoints and of the gradients an I leaves for its W (``hold_gradients``):
``Pipeline.saved_peak`` after a step with ``count_saved`` (``pipeforge profile`` measures a stage's bytes
with it). Rules: ``docs/semantics.md``.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import nullcontext
from typing import Any, NamedTuple

import torch

from pipeforge.runtime.copy_lane import copy_lane, move
from pipeforge.runtime.microbatch import as_tuple
from pipeforge.runtime.p2p import PipelineError, PipelineUsageError
from pipeforge.runtime.split_backward import Releasable, WeightPlan, held_gradients
from pipeforge.runtime.stage import MicrobatchState

Key = tuple[int, int, int]  # (stage, microbatch, chain)


class Checkpoint(NamedTuple):
    """What a recomputed forward keeps: its inputs (as they were before it: a copy of those it changes in
    place), which of them want a gradient, and the RNG state it started from."""

    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    target: Any
    rng: tuple[torch.Tensor, torch.Tensor | None]
    wants: tuple[bool, ...] | None = None  # ``StageRunner.forward``'s ``wants_grad``


SavedKey = tuple[int, int]  # (address, bytes) of what saved tensors keep alive: a storage, or a given input's own bytes


def saved_key(tensor: torch.Tensor, given: dict[SavedKey, list[SavedKey]] | None = None) -> SavedKey | None:
    """What a saved tensor keeps alive, counted once however many saved tensors reach it: its whole storage (a
    view keeps all of it alive: the q, k, v chunks of one projection are one storage, and one chunk saved alone
    keeps the three); in the storage of an input the forward was given (``given``, by storage: a microbatch's
    rows of the caller's batch, which the caller holds anyway), that input's own bytes; None for no storage."""
    storage = tensor.untyped_storage()
    base = storage.data_ptr()
    if base == 0:
        return None
    whole = (base, storage.nbytes())
    if given:
        regions = given.get(whole)
        if regions is not None:
            address = tensor.data_ptr()
            for start, size in regions:
                if start <= address < start + size:
                    return start, size
    return whole


class SavedBytes:
    """The bytes that saved tensors keep alive on this rank's device (each ``saved_key`` once) and their peak."""

    def __init__(self) -> None:
        self.held = 0
        self.peak = 0
        self._refs: dict[SavedKey, int] = {}  # key -> references
        self._given: dict[SavedKey, list[SavedKey]] = {}  # a storage -> the given inputs in it (``give``)

    def give(self, value: Any) -> None:
        """The inputs of a forward (its arguments, keywords, target; through tuples, lists and dicts): a saved
        tensor in one's storage counts that input's own bytes, not the whole storage (``saved_key``)."""
        for tensor in _tensors(value):
            storage = tensor.untyped_storage()
            if storage.data_ptr() == 0:
                continue
            region = (tensor.data_ptr(), tensor.numel() * tensor.element_size())
            regions = self._given.setdefault((storage.data_ptr(), storage.nbytes()), [])
            if region not in regions:
                regions.append(region)

    def add(self, tensor: torch.Tensor) -> SavedKey | None:
        key = saved_key(tensor, self._given)
        if key is None:
            return None
        count = self._refs.get(key, 0)
        self._refs[key] = count + 1
        if count == 0:
            self.held += key[1]
            if self.held > self.peak:
                self.peak = self.held
        return key

    def drop(self, key: SavedKey | None) -> None:
        if key is None:
            return
        count = self._refs.get(key, 0)
        if count == 0:
            return
        if count == 1:
            del self._refs[key]
            self.held -= key[1]
        else:
            self._refs[key] = count - 1


def hold_gradients(counter: SavedBytes, plan: WeightPlan | None) -> list[SavedKey | None]:
    """Count, after a microbatch's I, the gradients its plan holds until its W (``held_gradients``); the
    keys to drop at the W. One count for ``Pipeline.saved_peak`` and ``pipeforge profile``'s ``weight_grad``."""
    return [counter.add(t) for t in held_gradients(plan)]


def count_checkpoint(counter: SavedBytes, args: tuple, kwargs: dict | None, target: Any) -> list[SavedKey | None]:
    """Count what a recomputed forward keeps until its backward: its inputs (``args``, ``kwargs``; each storage
    once, a given input its own bytes: ``saved_key``; the ``target`` given, not counted); the keys to drop at
    the backward. One count for ``Pipeline.saved_peak`` and ``pipeforge profile``'s ``checkpoint``."""
    counter.give((args, kwargs, target))
    return [counter.add(t) for t in _tensors((args, kwargs))]


class _Saved(Releasable):
    """One saved tensor as autograd holds it (the packed value): counted while it lives on the device.
    It holds the tensor detached: an output saved with its own ``grad_fn`` would otherwise make a cycle
    through autograd (node, saved value, tensor, node) that Python's gc cannot see, alive after W. An I
    frees those its W does not need (``free``: ``split_backward.release_saved``)."""

    __slots__ = ("__weakref__", "address", "away", "counter", "tensor")

    def __init__(self, tensor: torch.Tensor, counter: SavedBytes | None):
        self.tensor: torch.Tensor | None = tensor  # None once an I frees it
        self.counter = counter
        self.address = counter.add(tensor) if counter is not None else None
        self.away = False

    def release(self) -> None:
        if self.counter is not None:
            self.counter.drop(self.address)
            self.address = None

    def free(self) -> None:
        self.tensor = None
        self.release()

    def __del__(self) -> None:
        self.release()


def counted(counter: SavedBytes | None, parameters: set[int], holder: list[_Saved] | None = None,
            inputs: Any = ()):
    """``saved_tensors_hooks`` that count every saved tensor in ``counter`` while autograd holds it (and list
    it in ``holder``, for OFFLOAD), a tensor in the storage of a parameter (``parameters``: storage
    addresses) excepted: what ``Pipeline.saved_peak`` and ``pipeforge profile``'s activation bytes count.
    ``inputs``: what the forward is given (``SavedBytes.give``: counted by their own bytes)."""
    if counter is not None and inputs:
        counter.give(inputs)

    def pack(tensor: torch.Tensor) -> Any:
        if tensor.untyped_storage().data_ptr() in parameters:
            return tensor  # a parameter: neither counted nor moved
        saved = _Saved(tensor.detach(), counter)
        if holder is not None:
            holder.append(saved)
        return saved

    def unpack(packed: Any) -> torch.Tensor:
        if isinstance(packed, _Saved):
            if packed.away:
                raise PipelineError("a saved activation was used while offloaded (RELOAD it first)")
            if packed.tensor is None:
                raise PipelineError("a saved activation that the split backward's I freed was used again "
                                    "(a node its W was not expected to run)")
            return packed.tensor
        return packed

    return torch.autograd.graph.saved_tensors_hooks(pack, unpack)


class SavedActivations:
    """One rank's recompute and offload state during one step (``RankContext.saved``)."""

    def __init__(self, recomputed: frozenset[Key], offloaded: frozenset[Key], device: torch.device | None,
                 count: bool = False):
        self.recomputed = recomputed
        self.offloaded = offloaded
        self.device = device
        self.counter = SavedBytes() if count else None
        self.checkpoints: dict[Key, Checkpoint] = {}
        self.holders: dict[Key, list[_Saved]] = {}
        self.kept: dict[Key, list[SavedKey | None]] = {}  # the counted tensors of each checkpoint, until the backward
        # (stage, chain) -> the inputs its recomputed forward changes in place (an argument's index, a keyword's
        # name), learned at its first; kept across steps as the pipeline keeps its shapes
        self.changed: dict[tuple[int, int], frozenset[int | str]] = {}
        self.carried: dict[tuple[int, int], tuple[bool, ...]] = {}  # (stage, chain) -> its outputs' flags, this step
        self.lane = copy_lane(device)  # OFFLOAD and RELOAD's copies (``copy_lane.py``: CPU and CUDA alike)
        self.finished = True  # nothing held since the last ``finish`` (``begin`` need not clear)

    def begin(self) -> None:
        """A new step (the pipeline keeps one of these): nothing held, nothing counted."""
        if not self.finished:  # the last step stopped before its end
            self.finish()
        self.finished = False
        self.counter = None
        self.carried.clear()  # learned again each step (a parameter made trainable since: announced, or refused)

    def start_counting(self) -> None:
        """Count the saved tensors' bytes of this step (``SavedBytes``)."""
        self.counter = SavedBytes()

    @property
    def tracked(self) -> bool:
        """Something to let go of after a backward (``backward_done``)."""
        return bool(self.holders or self.kept)

    @property
    def active(self) -> bool:
        return bool(self.recomputed or self.offloaded or self.counter is not None)

    # -- the forward --------------------------------------------------------------------

    def forward(self, runner, mb: int, args: tuple, target: Any, training: bool, kwargs: dict,
                wants: tuple[bool, ...] | None = None) -> Any:
        key = (runner.stage, mb, runner.chain)
        if training and key in self.recomputed:
            return self._checkpointed(runner, key, args, target, kwargs, wants)
        if not training or (key not in self.offloaded and self.counter is None):
            return runner.forward(mb, args, target, training, kwargs, wants)
        holder = self.holders.setdefault(key, []) if key in self.offloaded else None
        with self._hooks(runner, holder, (args, kwargs, target)):
            return runner.forward(mb, args, target, training, kwargs, wants)

    def _hooks(self, runner, holder: list[_Saved] | None, inputs: Any = ()):
        parameters = {p.untyped_storage().data_ptr() for p in runner.module.parameters()}
        return counted(self.counter, parameters, holder, inputs)

    def _checkpointed(self, runner, key: Key, args: tuple, target: Any, kwargs: dict,
                      wants: tuple[bool, ...] | None) -> Any:
        """The forward of a recomputed microbatch: its inputs and RNG state kept, its activations not. Its
        outputs carry a gradient exactly where R's will: the shapes header and a hand-over on this rank tell
        the next stage which of its inputs want one (a tensor sent without one stays without, and the next
        stage may change it in place). The stage's first in a step runs under autograd with saved-tensor hooks
        that keep nothing (no more memory than without autograd) to learn which (``carried``); the others
        run without autograd (the first takes 1.24 times their CPU, docs/runtime-internals.md) and say what
        it learned. Inputs the forward changes in place are kept as they were before it (``changed``: learned
        at the stage's first), so R starts from what F did."""
        if next(_tensors((args, kwargs)), None) is None:
            raise PipelineUsageError(_unkept(runner.rank, runner.stage, key[1], None, args, kwargs))
        rng = _rng_state(self.device)
        kept = tuple(a.detach() if isinstance(a, torch.Tensor) else a for a in args)
        where = (runner.stage, runner.chain)
        changed = self.changed.get(where)
        copies = _copies(kept, kwargs, changed)  # before the forward: what it may change in place
        versions = _versions(kept, kwargs)
        carried = self.carried.get(where)
        if runner.is_last:  # it sends nothing: no gradient flags to learn
            output = runner.forward(key[1], kept, target, False, kwargs, wants)
        elif carried is None:
            with torch.enable_grad(), torch.autograd.graph.saved_tensors_hooks(_unsaved, _never_unpacked):
                output = runner.forward(key[1], kept, target, True, kwargs, wants)
            carried = self.carried[where] = _carried(output)
            output = _flagged(output, carried)  # without its graph, flagged as it came
        else:
            output = _flagged(runner.forward(key[1], kept, target, False, kwargs, wants), carried)
        now = {k for k, v in _versions(kept, kwargs).items() if versions[k] != v}
        if changed is None:
            changed = self.changed[where] = frozenset(now)
        elif not now <= changed:
            raise PipelineError(_changed_later(runner, key[1], sorted(now - changed, key=str)))
        kept_args, kept_kwargs = _restored(kept, kwargs, copies, changed)
        self.checkpoints[key] = Checkpoint(kept_args, kept_kwargs, target, rng, wants)
        if self.counter is not None:  # the checkpoint is held until the backward, as simulate counts it
            self.kept[key] = count_checkpoint(self.counter, kept_args, kept_kwargs, target)
        # a state without a graph: the output's shapes for the gradient's receive, and "backward pending"
        runner.states[key[1]] = MicrobatchState(kept_args, output, ())
        return output

    # -- R ------------------------------------------------------------------------------

    def recompute(self, runner, mb: int) -> None:
        key = (runner.stage, mb, runner.chain)
        checkpoint = self.checkpoints.pop(key, None)
        if checkpoint is None:
            raise PipelineError(f"{runner.name}: R of microbatch {mb} without a checkpointed forward "
                                f"(no F before it, or the schedule does not recompute it)")
        losses, outputs = dict(runner.losses), dict(runner.outputs)
        devices = [self.device] if self.device is not None and self.device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices, enabled=True):
            _set_rng_state(checkpoint.rng, self.device)
            hooks = self._hooks(runner, None) if self.counter is not None else nullcontext()  # inputs: at F
            with torch.enable_grad(), hooks:
                runner.forward(mb, checkpoint.args, checkpoint.target, True, checkpoint.kwargs, checkpoint.wants)
        runner.losses.update(losses)  # the first forward's loss and outputs stand (the same numbers)
        runner.outputs.update(outputs)

    # -- OFFLOAD, RELOAD ----------------------------------------------------------------

    def offload(self, runner, mb: int) -> None:
        key = (runner.stage, mb, runner.chain)
        holder = self.holders.get(key)
        if holder is None:
            raise PipelineError(f"{runner.name}: OFFLOAD of microbatch {mb} without its forward")
        self._move(key, holder, torch.device("cpu"), away=True)

    def reload(self, runner, mb: int) -> None:
        key = (runner.stage, mb, runner.chain)
        holder = self.holders.get(key)
        if holder is None or not all(saved.away for saved in holder):
            raise PipelineError(f"{runner.name}: RELOAD of microbatch {mb} without its OFFLOAD")
        self._move(key, holder, self.device or torch.device("cpu"), away=False)

    def _move(self, key: Key, holder: list[_Saved], where: torch.device, away: bool) -> None:
        """Every saved tensor of ``holder`` copied to ``where`` on the copy lane (``copy_lane.move``: one copy
        of each storage's bytes they reach); counted off the device when ``away``, on it again when back."""
        kept = [(saved, saved.tensor) for saved in holder if saved.tensor is not None]  # not freed by an I
        moved, sources, copies = move(self.lane, [tensor for _, tensor in kept], where)
        for (saved, _), tensor in zip(kept, moved):
            saved.tensor = tensor  # the source is dropped (a host copy, or back on the device)
        self.lane.finish(key, sources, copies, away)
        for (saved, _), tensor in zip(kept, moved):
            if away:
                saved.release()  # off the device: no longer counted
            elif self.counter is not None:
                saved.address = self.counter.add(tensor)
            saved.away = away

    def wait(self, key: Key) -> None:
        """Before a backward of ``key``: its activations are rebuilt, and its reload's copy is complete (CUDA)."""
        if key in self.checkpoints:
            raise PipelineError(f"stage {key[0]}: backward of microbatch {key[1]} before its R")
        self.lane.wait(key)

    def input_done(self, key: Key, plan: WeightPlan | None) -> None:
        """After the I of ``key``: the gradients its plan holds until its W are counted (``hold_gradients``)."""
        if self.counter is not None and plan is not None:
            self.kept.setdefault(key, []).extend(hold_gradients(self.counter, plan))

    def backward_done(self, key: Key) -> None:
        """After the B or W of ``key``: its holder and its checkpoint go (autograd has freed what it saved)."""
        holder = self.holders.pop(key, None)
        if holder is not None:
            for saved in holder:
                saved.release()
        counter = self.counter
        for counted in self.kept.pop(key, ()):
            if counter is not None:
                counter.drop(counted)

    def finish(self) -> None:
        """After the step: nothing left behind."""
        self.holders.clear()
        self.checkpoints.clear()
        self.kept.clear()
        self.lane.clear()
        self.finished = True


def unkept_inputs(info, rank: int, inputs: list, own: list[dict] | None) -> str | None:
    """Why this rank cannot recompute stage 0 (``info.recomputed``): a microbatch whose inputs (the batch's
    arguments and keywords, ``inputs[m]``, and the stage's own, ``own[m]``) hold no tensor to keep; None if
    it can. Stages after the first get tensors from the stage before (checked at their F)."""
    for stage, mb, chain in info.recomputed:
        if stage != 0 or info.rank_of(0, chain) != rank or mb >= len(inputs):
            continue
        args, kwargs = inputs[mb]
        kwargs = {**kwargs, **(own[mb] if own else {})}
        if next(_tensors((args, kwargs)), None) is None:
            return _unkept(rank, 0, mb, info.recompute_source(0), args, kwargs)
    return None


def _unkept(rank: int | None, stage: int, mb: int, source: str | None, args: tuple, kwargs: dict) -> str:
    given = [f"argument {i} ({type(a).__name__})" for i, a in enumerate(args)]
    given += [f"keyword {k!r} ({type(v).__name__})" for k, v in kwargs.items()]
    where = f"rank {rank}: " if rank is not None else ""
    at = f" at {source}" if source else ""
    return (f"{where}stage {stage} is recomputed (its R of microbatch {mb}{at}) but its forward is given no tensor "
            f"input to keep: {', '.join(given) or 'nothing'}. R runs the forward again from the inputs its F kept, "
            f"so a stage whose data comes from elsewhere (an iterator, a buffer it changes) cannot be rebuilt: "
            f"give the stage its data as tensors, or do not recompute stage {stage}")


def _tensors(value: Any):
    """Every tensor in ``value`` (through tuples, lists and dicts)."""
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (tuple, list)):
        for item in value:
            yield from _tensors(item)
    elif isinstance(value, dict):
        for item in value.values():
            yield from _tensors(item)


def _changed_later(runner, mb: int, places: list) -> str:
    where = f"rank {runner.rank}: " if runner.rank is not None else ""
    named = ", ".join(f"argument {p}" if isinstance(p, int) else f"keyword {p!r}" for p in places)
    return (f"{where}{runner.name} is recomputed and its forward of microbatch {mb} changed {named} in place, "
            f"which its first recomputed forward did not: its R would start from the changed values. A recomputed "
            f"stage may change an input in place only if it does so at every forward")


def _unsaved(tensor: torch.Tensor) -> None:
    """A recomputed forward's saved-tensor hook: nothing is kept (R runs the forward again to save them)."""
    return None


def _never_unpacked(packed: None) -> torch.Tensor:
    raise PipelineError("a recomputed forward's graph was used for a backward (its R rebuilds the graph)")


def _inputs(args: tuple, kwargs: dict) -> Iterator[tuple[int | str, torch.Tensor]]:
    """A forward's tensor inputs by position (an argument's index, a keyword's name)."""
    for index, value in enumerate(args):
        if isinstance(value, torch.Tensor):
            yield index, value
    for name, value in kwargs.items():
        if isinstance(value, torch.Tensor):
            yield name, value


def _versions(args: tuple, kwargs: dict) -> dict[int | str, int]:
    return {place: tensor._version for place, tensor in _inputs(args, kwargs)}


def _copies(args: tuple, kwargs: dict, changed: frozenset[int | str] | None) -> dict[int | str, torch.Tensor]:
    """Copies of the inputs a forward changes in place (``changed``; None, not known yet: of every input)."""
    return {place: tensor.detach().clone() for place, tensor in _inputs(args, kwargs)
            if changed is None or place in changed}


def _restored(args: tuple, kwargs: dict, copies: dict[int | str, torch.Tensor],
              changed: frozenset[int | str]) -> tuple[tuple, dict]:
    """The inputs as they were before the forward: each one it changed in place replaced by its copy."""
    if not changed:
        return args, kwargs
    return (tuple(copies[i] if i in changed else a for i, a in enumerate(args)),
            {k: copies[k] if k in changed else v for k, v in kwargs.items()})


def _carried(output: Any) -> tuple[bool, ...]:
    """Which of an output's tensors carry a gradient (as the next stage is told)."""
    return tuple([isinstance(t, torch.Tensor) and t.requires_grad for t in as_tuple(output)])


def _flagged(output: Any, carried: tuple[bool, ...]) -> Any:
    """A forward's output without its graph, each tensor a new leaf carrying a gradient as ``carried`` says
    (the next stage's inputs want one exactly there; a tensor of a dtype without gradients never does)."""
    if isinstance(output, torch.Tensor):
        return output.detach().requires_grad_(carried[0] and _differentiable(output))
    if type(output) is tuple and len(output) == len(carried):
        return tuple([t.detach().requires_grad_(flag and _differentiable(t)) if isinstance(t, torch.Tensor) else t
                      for t, flag in zip(output, carried)])
    return output


def _differentiable(tensor: torch.Tensor) -> bool:
    return tensor.is_floating_point() or tensor.is_complex()


def _rng_state(device: torch.device | None) -> tuple[torch.Tensor, torch.Tensor | None]:
    cuda = torch.cuda.get_rng_state(device) if device is not None and device.type == "cuda" else None
    return torch.get_rng_state(), cuda


def _set_rng_state(state: tuple[torch.Tensor, torch.Tensor | None], device: torch.device | None) -> None:
    torch.set_rng_state(state[0])
    if state[1] is not None:
        assert device is not None, "a CUDA state is taken only for a CUDA device (_rng_state)"
        torch.cuda.set_rng_state(state[1], device)


__all__ = ["Checkpoint", "SavedActivations", "SavedBytes", "count_checkpoint", "counted", "hold_gradients", "saved_key",
           "unkept_inputs"]
