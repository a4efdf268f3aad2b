"""One stage replica on one rank: forward, full backward, and backward split into I and W.

Each stage's autograd graph is its own: the activation a stage receives (from a
peer or from the previous stage on the same rank) is detached into a leaf, so
backward stops at the stage boundary and hands the input gradient on.

- ``B`` (full backward) runs one ``torch.autograd.backward`` that accumulates
  the parameters' ``.grad`` and yields the input gradient.
- ``I`` computes only the input gradient, recording on the way what W needs;
  parameters are untouched (``pipeforge.runtime.split_backward``).
- ``W`` computes the parameters' gradients from what I recorded and
  accumulates them into ``.grad``; the graph is released.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from pipeforge.runtime.aux import WithAuxLoss
from pipeforge.runtime.aux import unwrap as unwrap_aux
from pipeforge.runtime.microbatch import as_tuple
from pipeforge.runtime.p2p import PipelineError, PipelineUsageError
from pipeforge.runtime.split_backward import (
    ScalarSeed,
    SplitBackward,
    WeightPlan,
    accumulate_weight_gradients,
    run_backward,
)

if TYPE_CHECKING:
    from pipeforge.runtime.custom import StageAction


class StageError(PipelineError):
    """An exception inside a stage's module during ``step()``/``eval()``, with where it happened."""

    stage: int | None  # (None: a custom function's action of no stage, an OVERLAP_F_B: ``CustomFunctionError``)
    microbatch: int | None

    def __init__(self, runner: StageRunner, kind: str, mb: int, error: Exception):
        self.rank, self.stage, self.chain, self.microbatch = runner.rank, runner.stage, runner.chain, mb
        self.original = error
        self.action = f"{runner.stage}{kind}{mb}" + (f"@{runner.chain}" if runner.chain else "")
        where = f"rank {runner.rank}: " if runner.rank is not None else ""
        super().__init__(f"{where}{runner.name}, microbatch {mb}, action {self.action}: "
                         f"{type(error).__name__}: {error}")


class CustomFunctionError(StageError):
    """An exception inside a custom function (``make_pipeline(custom_functions=...)``) during ``step()``/``eval()``:
    the rank, the action's stage, chain, microbatch and name, and the function (``StageError``'s fields, so a peer
    learns where it failed; ``stage`` and ``microbatch`` are None for an action without them)."""

    def __init__(self, rank: int, action: StageAction, function: Callable, error: Exception):
        self.rank, self.stage, self.chain, self.microbatch = rank, action.stage, action.chain, action.microbatch
        self.original = error
        self.action = str(action)
        name = getattr(function, "__qualname__", None) or type(function).__name__
        where = "" if action.stage is None else f" of stage {action.stage}" + (
            f" (chain {action.chain})" if action.chain else "")
        where += "" if action.microbatch is None else f", microbatch {action.microbatch}"
        PipelineError.__init__(self, f"rank {rank}: custom function {name!r} for {action.kind}{where}, action "
                                     f"{self.action}: {type(error).__name__}: {error}")


class PeerStageError(PipelineError):
    """This rank's step stopped because another rank failed it (its ``StageError``, or another exception):
    ``failed_rank`` and, when a stage raised, its ``stage``, ``chain``, ``microbatch`` and ``action``; the
    error this rank's own wait raised is the ``__cause__`` (``pipeforge.runtime.recovery``)."""

    def __init__(self, rank: int, record: dict, here: Exception):
        self.rank, self.failed_rank = rank, record["rank"]
        self.stage, self.chain = record.get("stage"), record.get("chain")
        self.microbatch, self.action = record.get("microbatch"), record.get("action")
        what = record["message"].removeprefix(f"rank {self.failed_rank}: ")
        if record.get("refused"):
            text = f"rank {rank}: rank {self.failed_rank} refused this step: {what}"
        else:
            where = f" at {what}" if self.action is not None else f": {what}"
            text = f"rank {rank}: the step stopped because rank {self.failed_rank} failed{where}"
        super().__init__(f"{text} (this rank learned it here: {here})")

    @staticmethod
    def of(rank: int, record: dict, here: Exception) -> PeerStageError:
        """The error for ``record``: a ``PeerRefusedError`` where the failing rank refused the step's arguments."""
        return (PeerRefusedError if record.get("refused") else PeerStageError)(rank, record, here)


class PeerRefusedError(PeerStageError, PipelineUsageError):
    """Another rank refused the step for its arguments (a batch of another shape, a missing target, rows
    that do not split like the batch): its message, with ``failed_rank`` naming it."""


@dataclass(slots=True)
class MicrobatchState:
    """What a stage keeps for one microbatch between its forward and its backward."""

    inputs: tuple[Any, ...]
    output: Any
    roots: tuple[torch.Tensor, ...] = ()
    root_grads: tuple[torch.Tensor | None, ...] = ()
    weight_plan: WeightPlan | None = None  # left by I for W
    aux: torch.Tensor | None = None  # the stage's auxiliary loss (``pipeforge.runtime.aux``): gradient one


@dataclass
class StageRunner:
    module: torch.nn.Module
    stage: int
    chain: int
    is_first: bool
    is_last: bool
    loss_fn: Callable | None = None
    states: dict[int, MicrobatchState] = field(default_factory=dict)
    # the last stage's losses and outputs by microbatch, as the module and loss_fn made them (graphs included:
    # a detach costs as much per microbatch as the rest of the bookkeeping); whoever hands them out detaches
    losses: dict[int, torch.Tensor] = field(default_factory=dict)
    outputs: dict[int, Any] = field(default_factory=dict)
    split: SplitBackward = field(default_factory=SplitBackward)  # what I keeps between microbatches
    seed: ScalarSeed = field(default_factory=ScalarSeed)  # the loss's gradient one, made once
    rank: int | None = None  # named in errors
    next_local: bool | None = None  # the next stage runs on this rank too (set by the rank context once)
    previous_local: bool | None = None  # the previous stage runs on this rank too
    # the module changes in place an input that wants a gradient (a leaf, where torch refuses it): learned at the
    # stage's first forward with such an input, given copies then (``_given``); from then on copies where True
    changes_inputs: bool | None = None

    @property
    def name(self) -> str:
        return f"stage {self.stage}" + (f" (chain {self.chain})" if self.chain else "")

    def forward(self, mb: int, args: tuple[Any, ...], target: Any, training: bool,
                kwargs: dict[str, Any] | None = None, wants_grad: tuple[bool, ...] | None = None) -> Any:
        """Run the module on one microbatch: ``args`` from the previous stage (or the batch), ``kwargs``
        this stage's own inputs (the batch's keywords on stage 0, per-stage inputs on every stage).
        ``wants_grad``: which of a later stage's ``args`` want a gradient (``None``: every floating-point one)."""
        if torch.is_grad_enabled() != training:  # the pipeline runs its program in the right mode already
            with torch.set_grad_enabled(training):
                return self.forward(mb, args, target, training, kwargs, wants_grad)
        given = args
        if not self.is_first:
            if wants_grad is None:
                args = tuple([_as_leaf(a, training) for a in args])
            else:
                args = tuple([_as_leaf(a, training and wants) for a, wants in zip(args, wants_grad)])
            given = args if self.changes_inputs is False or not training else self._given(args)
        is_last = self.is_last
        try:
            result = self.module(*given, **kwargs) if kwargs else self.module(*given)
            output, aux = unwrap_aux(result, self.name) if isinstance(result, WithAuxLoss) else (result, None)
            loss = None
            if is_last and (training or target is not None) and self.loss_fn is not None:
                loss = self.loss_fn(output, target)
                if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
                    raise PipelineError(f"loss_fn must return a scalar tensor, got {type(loss).__name__}")
        except PipelineError:
            raise
        except Exception as error:
            raise self._forward_error(mb, error) from error
        if given is not args and self.changes_inputs is None:
            self.changes_inputs = any([copy is not leaf and copy._version > 0 for copy, leaf in zip(given, args)])
        if is_last:  # kept as they are: detached when the step hands them out
            self.outputs[mb] = output
            if loss is not None:
                self.losses[mb] = loss
        if not training:
            return output
        if aux is not None and not aux.requires_grad:
            aux = None
        roots: tuple[torch.Tensor, ...]
        if is_last:
            assert loss is not None, "a last stage trains with a loss (Pipeline refuses training without loss_fn)"
            roots = (loss if aux is None else loss + aux,)
        elif type(output) is torch.Tensor:  # one tensor (most stages): as the general rule below has it
            roots = (output,) if output.requires_grad and output.is_floating_point() else ()
            roots += (aux,) if aux is not None else ()
        else:
            roots = tuple(t for t in as_tuple(output) if _is_float(t) and _has_graph(t))
            roots += (aux,) if aux is not None else ()
        self.states[mb] = MicrobatchState(args, output, roots, (), None, aux)
        return output

    def _given(self, leaves: tuple[Any, ...]) -> tuple[Any, ...]:
        """What the module is given for ``leaves`` (its inputs wanting a gradient are leaves, which torch lets no
        operation change in place): a copy of each such input, where the stage changes one in place or is not known
        not to (its first forward that has one), so it trains as it would unpipelined; the leaves themselves else."""
        if not any([_has_graph(a) for a in leaves]):
            return leaves
        return tuple([a.clone() if _has_graph(a) else a for a in leaves])

    def _forward_error(self, mb: int, error: Exception) -> StageError:
        """A forward's failure; where the module changed in place an input it was given as a leaf (its first
        forward changed none), the stage is given copies from its next forward on, and the error says so."""
        failure = StageError(self, "F", mb, error)
        if self.changes_inputs is False and _LEAF_CHANGED in str(error):
            self.changes_inputs = True
            failure.args = (f"{failure.args[0]} (stage {self.stage} changed in place an input that wants a "
                            "gradient, which its first forward did not: from its next forward on it is given "
                            "copies of such inputs)",)
        return failure

    def detached_losses(self) -> dict[int, torch.Tensor]:
        """The losses computed so far, by microbatch, without their graphs."""
        return {mb: loss.detach() for mb, loss in self.losses.items()}

    def output_metas(self, mb: int) -> tuple[torch.Tensor, ...]:
        """The output tensors of microbatch ``mb`` whose gradients a later stage sends back."""
        return tuple(t for t in as_tuple(self.states[mb].output) if _is_float(t))

    def _set_output_grads(self, mb: int, grads: tuple[torch.Tensor | None, ...] | None) -> MicrobatchState:
        """The gradients arriving for the output's floating-point tensors, position by position (one tensor
        returned twice gets both positions' gradients: autograd sums them into it)."""
        state = self._state(mb)
        if self.is_last:
            state.root_grads = (None,)  # the scalar loss: gradient one
            return state
        output = state.output
        if type(output) is torch.Tensor and state.aux is None:  # one tensor: as the general rule below has it
            if not (output.requires_grad and output.is_floating_point()):
                state.root_grads = ()
            else:
                grad = grads[0] if grads else None
                state.root_grads = (grad if grad is not None else torch.zeros_like(output),)
            return state
        floats = [t for t in as_tuple(output) if _is_float(t)]
        grads = tuple(grads or ())
        # an output no later stage used gets a zero gradient
        state.root_grads = tuple(
            grads[i] if i < len(grads) and grads[i] is not None else torch.zeros_like(t)
            for i, t in enumerate(floats) if _has_graph(t)
        ) + ((torch.ones_like(state.aux),) if state.aux is not None else ())
        return state

    def backward(self, mb: int, grads: tuple | None) -> tuple[torch.Tensor | None, ...]:
        """Full backward (B): parameters' grads accumulated, the floating-point inputs' grads returned."""
        if self.is_last:  # the loss (with the stage's auxiliary loss): gradient one, the seed made once
            state = self.states.pop(mb, None)
            if state is None:
                raise self._missing(mb)
            try:
                self.seed.backward(state.roots[0])
            except PipelineError:
                raise
            except Exception as error:
                raise StageError(self, "B", mb, error) from error
        else:
            state = self._set_output_grads(mb, grads)
            del self.states[mb]
            if state.roots:
                try:
                    run_backward(state.roots, state.root_grads)
                except PipelineError:
                    raise
                except Exception as error:
                    raise StageError(self, "B", mb, error) from error
        return () if self.is_first else tuple([a.grad for a in state.inputs if _is_float(a)])

    def backward_input(self, mb: int, grads: tuple | None) -> tuple[torch.Tensor | None, ...]:
        """Backward for inputs (I): parameters untouched; what W needs is kept; the floating-point inputs'
        grads returned."""
        state = self._set_output_grads(mb, grads)
        wanted = [] if self.is_first else [a for a in state.inputs if isinstance(a, torch.Tensor) and a.requires_grad]
        try:
            found, state.weight_plan = self.split.backward_input(state.roots, state.root_grads, wanted, self._params())
        except PipelineError:
            raise
        except Exception as error:
            raise StageError(self, "I", mb, error) from error
        by_id = {id(a): g for a, g in zip(wanted, found)}
        return tuple(by_id.get(id(a)) for a in state.inputs if _is_float(a))

    def weight_plan(self, mb: int) -> WeightPlan | None:
        """What microbatch ``mb``'s I left for its W (None before its I, or after its W)."""
        state = self.states.get(mb)
        return state.weight_plan if state is not None else None

    def note(self, mb: int) -> str:
        """What microbatch ``mb``'s I did other than split its backward (``WeightPlan.note``), or ``""``."""
        state = self.states.get(mb)
        plan = state.weight_plan if state is not None else None
        return plan.note if plan is not None else ""

    def backward_weight(self, mb: int) -> None:
        """Backward for weights (W): accumulate the parameters' grads of microbatch ``mb``."""
        state = self._state(mb)
        if state.weight_plan is None:
            raise PipelineError(f"{self.name}: W of microbatch {mb} before its I")
        del self.states[mb]
        try:
            accumulate_weight_gradients(state.weight_plan)
        except PipelineError:
            raise
        except Exception as error:
            raise StageError(self, "W", mb, error) from error

    def _params(self) -> list[torch.nn.Parameter]:
        return [p for p in self.module.parameters() if p.requires_grad]

    def _state(self, mb: int) -> MicrobatchState:
        state = self.states.get(mb)
        if state is None:
            raise self._missing(mb)
        return state

    def _missing(self, mb: int) -> PipelineError:
        return PipelineError(f"{self.name}: backward of microbatch {mb} without its forward")

    def reset(self) -> None:
        self.states.clear()
        self.losses.clear()
        self.outputs.clear()


_LEAF_CHANGED = "leaf Variable that requires grad is being used in an in-place operation"  # torch's (a leaf, a view)


def _is_float(value: Any) -> bool:
    return isinstance(value, torch.Tensor) and value.is_floating_point()


def _has_graph(value: Any) -> bool:
    return isinstance(value, torch.Tensor) and value.requires_grad


def _as_leaf(value: Any, training: bool) -> Any:
    if not isinstance(value, torch.Tensor):
        return value
    return value.detach().requires_grad_(training and value.is_floating_point())
