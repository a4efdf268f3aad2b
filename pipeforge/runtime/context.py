"""The rank context: what a generated rank function calls, one method per kind of action.

``RankContext`` (one per rank and step) is the ``ctx`` of a generated ``rank_3(ctx)``: ``forward``,
``backward``, ``backward_input``, ``backward_weight`` (method names from ``semantics.RUNTIME_METHODS``)
compute a stage's action, taking inputs from the batch, the previous stage on this rank or a posted
receive (waited where used); ``post`` issues one communication group (``p2p.Transport``). Its hook
points, the same for every pipeline: ``functions`` (custom functions, ``custom.py``), ``data_parallel``
(``fsdp.py``: UNSHARD, RESHARD, REDUCE_GRAD), ``observers`` (``Observer``: the step trace). In eval mode
backward actions and communication are skipped. How data moves: ``docs/runtime-internals.md``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cached_property
from types import MethodType
from typing import Any

import torch

from pipeforge.ir import COMM_KINDS, Action, ActionKind, parse_action
from pipeforge.runtime.custom import COMPUTE_KINDS, ActionContext, CustomFunction, StageAction
from pipeforge.runtime.fsdp import DataParallel
from pipeforge.runtime.memory import ActivationCount
from pipeforge.runtime.microbatch import as_tuple
from pipeforge.runtime.p2p import (
    PipelineError,
    Posted,
    TensorMeta,
    Transfer,
    Transport,
    decode_header,
    empty_header,
    encode_header,
)
from pipeforge.runtime.rng import StepRng
from pipeforge.runtime.saved import SavedActivations
from pipeforge.runtime.stage import CustomFunctionError, StageRunner
from pipeforge.semantics import GRADIENT_KINDS, RUNTIME_METHODS, SENDS, early_receives, lane, peer_stage

SEND_F, RECV_F, SEND_B, RECV_B = ActionKind.SEND_F, ActionKind.RECV_F, ActionKind.SEND_B, ActionKind.RECV_B
FORWARD_COMMS = frozenset({SEND_F, RECV_F})  # what eval() keeps
BACKWARD_KINDS = frozenset({*(kind for kind in COMPUTE_KINDS if kind != "F"), "REDUCE_GRAD"})  # what eval() skips
WEIGHT_GRADIENT_KINDS = frozenset(kind.value for kind in GRADIENT_KINDS)  # after them: data_parallel's upcast
FORWARD_KINDS = frozenset({"F", "R"})  # run the stage's forward (R again, under autograd)
Comm = Action  # what send_f/recv_f/send_b/recv_b return and post takes: the communication action itself
# the runtime's own compute of each kind, below the hooks: ``_<method>`` for the method generated code calls
# (``semantics.RUNTIME_METHODS``), which goes through the hooks
OWN_COMPUTES = {kind: "_" + RUNTIME_METHODS[ActionKind(kind)] for kind in COMPUTE_KINDS}
_F, _B = ActionKind.F, ActionKind.B  # (a module constant: an Enum member read per action costs a lookup)


@dataclass(frozen=True)
class ScheduleInfo:
    """The facts about a schedule the runtime needs (written by codegen as literals)."""

    name: str
    ranks: int
    stages: int
    microbatches: int
    placements: tuple[tuple[int, ...], ...]
    recomputed: tuple[tuple[int, int, int], ...] = ()  # (stage, microbatch, chain) that R rebuilds
    offloaded: tuple[tuple[int, int, int], ...] = ()  # (stage, microbatch, chain) that OFFLOAD moves to host
    recompute_sources: tuple[tuple[int, str], ...] = ()  # (stage, "file:line:col" of its first R), for errors
    # ((stage, kind, microbatch, chain) of a step that adds memory, (stage, microbatch, chain) of the OFFLOAD
    # whose copy it waits for): the copy lane rule (semantics.offload_waits), only where the limit needs it
    offload_waits: tuple[tuple[tuple[int, str, int, int], tuple[int, int, int]], ...] = ()

    @cached_property
    def offload_wait_keys(self) -> dict[tuple[int, str, int, int], tuple[int, int, int]]:
        """``offload_waits`` as a map from the step that waits to the OFFLOAD it waits for."""
        return {(stage, kind, mb, chain): key for (stage, kind, mb, chain), key in self.offload_waits}

    def recompute_source(self, stage: int) -> str | None:
        """Where the schedule's first R of ``stage`` was written (None: not known)."""
        return next((source for s, source in self.recompute_sources if s == stage), None)

    def rank_of(self, stage: int, chain: int = 0) -> int:
        return self.placements[chain][stage]

    def stages_of(self, rank: int) -> tuple[int, ...]:
        """The stages ``rank`` runs (in either chain), ascending: the keys its ``stage_modules`` needs."""
        if not 0 <= rank < self.ranks:
            raise PipelineError(f"rank {rank} is out of range: schedule {self.name!r} runs on ranks "
                                f"0..{self.ranks - 1}")
        return tuple(sorted({stage for stage, _ in self.held(rank)}))

    def held(self, rank: int) -> tuple[tuple[int, int], ...]:
        """Every (stage, chain) whose replica lives on ``rank``."""
        return tuple(
            (stage, chain)
            for chain, placement in enumerate(self.placements)
            for stage, owner in enumerate(placement)
            if owner == rank
        )


class Observer:
    """A hook point told what a rank does, as it does it (every method a no-op here): the step trace
    (``pipeforge.runtime.step_trace.Tracer``) and records of where a rank was implement it.

    ``kind`` is ``"F"``, ``"B"``, ``"I"`` or ``"W"`` for a compute and ``ActionKind.RECV_F`` /
    ``RECV_B`` for a wait. A wait happens inside the compute that needs its data."""

    def begin_program(self) -> None: ...

    def begin_compute(self, kind: str, stage: int, mb: int, chain: int) -> None: ...

    def end_compute(self, kind: str, stage: int, mb: int, chain: int) -> None: ...

    def annotate(self, note: str) -> None:
        """The running compute did something worth saying (the split backward's ``note``), before its end."""

    def begin_wait(self, kind: ActionKind, stage: int, mb: int, chain: int) -> None: ...

    def end_wait(self, kind: ActionKind, stage: int, mb: int, chain: int) -> None: ...

    def begin_post(self, comms: tuple[Comm, ...]) -> None: ...

    def end_post(self, comms: tuple[Comm, ...]) -> None: ...

    def begin_finish(self) -> None: ...

    def end_finish(self) -> None: ...


def _stage(action: StageAction) -> int:
    """The stage of an action that names one (every kind but OVERLAP_F_B: ``StageAction``)."""
    assert action.stage is not None, f"{action.kind} names a stage"
    return action.stage


def _microbatch(action: StageAction) -> int:
    """The microbatch of a compute action (every compute names one)."""
    assert action.microbatch is not None, f"{action.kind} names a microbatch"
    return action.microbatch


def _no_note(note: str) -> None:
    pass


def _skipped(stage: int, mb: int, chain: int = 0) -> None:
    """A backward kind's action in an eval on the direct path: skipped."""


class _ComputeMethod:
    """``RankContext.forward`` and the method of every other compute kind (``semantics.RUNTIME_METHODS``).

    Read from a context with no hook to run around a compute (``RankContext._direct``), it is the
    runtime's own compute of the kind, bound to it (``_forward``), so an action is one call (generated
    code binds each method once per step); in an eval, a kind that eval skips reads as a no-op there. Read
    from any other context, it is the call through the hooks (``_issue_compute``); read from the class,
    that call as a plain function."""

    def __init__(self, kind: str, doc: str | None = None):
        self.kind = kind
        self.own = OWN_COMPUTES[kind]

        def through_hooks(ctx: RankContext, stage: int, mb: int, chain: int = 0) -> None:
            ctx._issue_compute(kind, stage, mb, chain)

        through_hooks.__doc__ = self.__doc__ = doc
        self.through_hooks = through_hooks

    def __set_name__(self, owner: type, name: str) -> None:
        self.through_hooks.__name__ = self.through_hooks.__qualname__ = name

    def __get__(self, ctx: RankContext | None, owner: type | None = None) -> Callable[..., None]:
        if ctx is None:
            return self.through_hooks
        if not ctx._direct:
            return MethodType(self.through_hooks, ctx)
        if ctx.training or self.kind == "F":
            return getattr(ctx, self.own)
        return _skipped


class RankContext:
    """The state of one rank during one ``step`` or ``eval``, with its hook points (module docstring)."""

    def __init__(self, info: ScheduleInfo, rank: int, runners: dict[tuple[int, int], StageRunner],
                 transport: Transport, caches: ShapeCache, *, training: bool = True,
                 functions: dict[str, CustomFunction] | None = None, data_parallel: DataParallel | None = None,
                 observers: tuple[Observer, ...] = (), rng: StepRng | None = None,
                 saved: SavedActivations | None = None):
        self.info = info
        self.rank = rank
        self.runners = runners
        self.transport = transport
        self.caches = caches
        self.training = training
        self.functions = dict(functions or {})
        self.data_parallel = data_parallel if data_parallel is not None else DataParallel(rank, {})
        self.observers = tuple(observers)
        self.rng = rng  # each forward's seeding (``rng.py``; None: the caller's RNG as it goes)
        self.inputs: list[tuple[tuple[Any, ...], dict[str, Any]]] = []  # stage 0's (args, kwargs) per microbatch
        self.stage_inputs: dict[int, list[dict[str, Any]]] = {}  # a stage's keyword inputs per microbatch
        self.targets: list[Any] = []
        self.activations = ActivationCount()  # what simulate's memory model counts (O(1) per action)
        self._log = self.activations.log.append  # the direct path's record: one C call an action
        # R, OFFLOAD, RELOAD (runtime/saved.py): the pipeline's own, begun for this step, or one of its own
        self.saved = saved if saved is not None else SavedActivations(
            frozenset(info.recomputed), frozenset(info.offloaded), transport.device)
        self._offload_waits = info.offload_wait_keys
        self._handed: dict[Action, Any] = {}
        self._outbox: dict[Action, tuple[torch.Tensor, ...]] = {}
        self._pending: dict[Action, tuple[Posted, tuple[torch.Tensor, ...]]] = {}
        self._sent: list[Posted] = []
        self._early: frozenset[Comm] = frozenset()  # the receives posted ahead of the program (``post_early``)
        self._collecting: list[StageAction] | None = None  # the overlap step being collected for custom functions
        # no hook to run around a compute: actions go straight to their stage
        self._direct = not self.functions and not self.observers and not self.data_parallel.hooks_compute
        self._plain = False  # no RNG seeding, recompute, offload or byte count this step (``begin_program``)
        for runner in runners.values():
            if runner.next_local is None:  # the stages on either side, on this rank or not: a fact of placement
                runner.next_local = not runner.is_last and self._local(runner.stage + 1, runner.chain)
                runner.previous_local = not runner.is_first and self._local(runner.stage - 1, runner.chain)

    # -- the actions a generated rank function calls -------------------------------

    forward = _ComputeMethod("F")
    backward = _ComputeMethod("B")
    backward_input = _ComputeMethod("I")
    backward_weight = _ComputeMethod("W")
    recompute = _ComputeMethod("R", "R: the forward of a recomputed microbatch again, under autograd, from its "
                                    "checkpoint.")
    offload = _ComputeMethod("OFFLOAD", "OFFLOAD: the microbatch's saved tensors to host memory.")
    reload = _ComputeMethod("RELOAD", "RELOAD: the microbatch's saved tensors back to the device (waited before "
                                      "its backward).")

    def reduce_grad(self, stage: int, chain: int = 0) -> None:
        """The stage's gradients are complete on this rank (every replica of it here: REDUCE_GRAD
        names a stage, not a chain). They are summed across chains and scaled after the program."""
        if self._direct:  # no custom function, observer or sharded stage
            if self.training:  # what ``run_default`` does, without the ``StageAction`` only a custom function sees
                self._reduce_grad(stage)
                self.data_parallel.reduce(stage)
            return
        self.issue(StageAction("REDUCE_GRAD", stage))

    def unshard(self, stage: int, chain: int = 0) -> None:
        self.issue(StageAction("UNSHARD", stage))

    def reshard(self, stage: int, chain: int = 0) -> None:
        self.issue(StageAction("RESHARD", stage))

    @contextmanager
    def overlap(self) -> Iterator[None]:
        """An overlap step: its actions are issued back to back, none waits for another. With custom
        functions they are collected and issued as one OVERLAP_F_B."""
        if not self.functions:
            with self.activations.overlap():
                yield
            return
        if self._collecting is not None:
            raise PipelineError(f"rank {self.rank}: an overlap step inside another")
        self._collecting = []
        try:
            yield
            halves = tuple(self._collecting)
        finally:
            self._collecting = None
        self.issue(StageAction("OVERLAP_F_B", None, sub_actions=halves))

    def send_f(self, stage: int, mb: int, chain: int = 0) -> Comm:
        return Action(stage, SEND_F, mb, chain)

    def recv_f(self, stage: int, mb: int, chain: int = 0) -> Comm:
        return Action(stage, RECV_F, mb, chain)

    def send_b(self, stage: int, mb: int, chain: int = 0) -> Comm:
        return Action(stage, SEND_B, mb, chain)

    def recv_b(self, stage: int, mb: int, chain: int = 0) -> Comm:
        return Action(stage, RECV_B, mb, chain)

    def post(self, *comms: Comm | str) -> None:
        """Post one communication group: its sends, then its receives; receives are waited where used.
        Generated code names each action by its torch token, ``post('1SEND_B0', '1RECV_F1')`` (``posted``);
        modules generated before pass the actions ``send_f(1, 0)``... make.

        The first time an activation crosses to a peer its shapes go first: the sender posts a header
        just ahead of the data, and the receiver waits for the header before it posts the data's
        receive (the receive of a group waits for its matching send to be posted: the buffered
        semantics of ``docs/semantics.md``, which every rendezvous-valid schedule satisfies too).
        """
        group = _GROUPS.get(comms)
        if group is None:
            group = posted(comms, self.rank)
        if not self.observers:
            self._post(group)
            return
        for observer in self.observers:
            observer.begin_post(group)
        self._post(group)
        for observer in self.observers:
            observer.end_post(group)

    def post_early(self, receives: tuple[Comm, ...]) -> None:
        """Before the program: post the receives of ``receives`` (the program's, in posting order) that
        ``semantics.early_receives`` lets go ahead, those whose buffers are known (from the second step on),
        each its own batch, waited where its data is used as always; the program's ``post`` then skips
        them. Only on a transport whose every op progresses on its own (gloo's)."""
        if not self.transport.reconnectable:
            return
        plan = self.caches.early_plan(receives, self.info, self.training)
        if not plan:
            return
        observers = self.observers
        comms = tuple(comm for comm, _, _ in plan) if observers else ()
        for observer in observers:
            observer.begin_post(comms)
        post, buffers, device, pending = self.transport.post, self.caches.buffers, self.transport.device, self._pending
        for comm, peer, label in plan:
            tensors = buffers(comm, device)
            pending[comm] = (post([Transfer(False, t, peer) for t in tensors], label), tensors)
        self._early = self.caches.early_set(self.training)
        for observer in observers:
            observer.end_post(comms)

    # -- dispatch through the hooks ----------------------------------------------------

    def issue(self, action: StageAction) -> None:
        """Run ``action`` as the pipeline does: its kind's custom function if one is registered, else the
        runtime's own (``run_default``); inside an overlap step with custom functions, collect it."""
        if self._collecting is not None:
            self._collecting.append(action)
            return
        if not self.training and action.kind in BACKWARD_KINDS:
            return
        function = self.functions.get(action.kind)
        if function is None:
            self.run_default(action)
        else:
            try:
                function(action, ActionContext(self, action))
            except PipelineError:  # the runtime's own (a stage's failure in ctx.default(), a peer's): as it is
                raise
            except Exception as error:
                raise CustomFunctionError(self.rank, action, function, error) from error

    def run_default(self, action: StageAction) -> None:
        """The runtime's own implementation of ``action``, its hooks included."""
        kind = action.kind
        if kind in OWN_COMPUTES:
            self._compute(kind, _stage(action), _microbatch(action), action.chain)
        elif kind == "OVERLAP_F_B":
            with self.activations.overlap():  # one step for the activation count: additions, then releases
                for half in action.sub_actions:
                    self.issue(half)
        elif kind == "UNSHARD":
            self.data_parallel.unshard(_stage(action))
        elif kind == "RESHARD":
            self.data_parallel.reshard(_stage(action))
        elif kind == "REDUCE_GRAD":
            self._reduce_grad(_stage(action))
            self.data_parallel.reduce(_stage(action))
        else:
            raise PipelineError(f"rank {self.rank}: unknown action kind {kind!r}")

    def _issue_compute(self, kind: str, stage: int, mb: int, chain: int) -> None:
        """``issue`` of a compute action; without a custom function for its kind the default runs at
        once, without making the ``StageAction`` only a custom function would see."""
        if self._collecting is None and kind not in self.functions:
            self._compute(kind, stage, mb, chain)
        else:
            self.issue(StageAction(kind, stage, mb, chain))

    def _compute(self, kind: str, stage: int, mb: int, chain: int) -> None:
        """A compute action with its hooks: the observers, the stage's data parallelism around the compute."""
        if not self.training and kind != "F":
            return
        observers = self.observers
        for observer in observers:
            observer.begin_compute(kind, stage, mb, chain)
        data_parallel = self.data_parallel
        if lane(ActionKind(kind)) == "copy":  # OFFLOAD, RELOAD: the stage's parameters play no part
            getattr(self, OWN_COMPUTES[kind])(stage, mb, chain)
        else:
            data_parallel.before_compute(stage, kind not in FORWARD_KINDS)
            getattr(self, OWN_COMPUTES[kind])(stage, mb, chain)
        if kind in WEIGHT_GRADIENT_KINDS and stage in data_parallel.upcasting:
            data_parallel.after_weight_gradients(stage)
        for observer in observers:
            observer.end_compute(kind, stage, mb, chain)

    # -- the runtime's own compute ------------------------------------------------------

    def _wait_offload(self, stage: int, kind: str, mb: int, chain: int) -> None:
        """Before a step that adds memory: the OFFLOAD the copy lane rule names for it has ended."""
        key = self._offload_waits.get((stage, kind, mb, chain))
        if key is not None:
            self.saved.lane.wait_offload(key)

    def _forward(self, stage: int, mb: int, chain: int = 0) -> None:
        runner = self.runners.get((stage, chain)) or self.runner(stage, chain)
        wants = None  # which inputs want a gradient (None: every floating-point one)
        if stage == 0:
            inputs = self.inputs
            if not inputs:
                raise PipelineError(f"rank {self.rank} holds stage 0 and needs the batch: pass inputs to step()")
            args, kwargs = inputs[mb]
        else:
            args, wants = self._input(stage, chain, mb)
            kwargs = {}
        if self.stage_inputs:
            own = self.stage_inputs.get(stage)
            if own is not None:
                kwargs = {**kwargs, **own[mb]}
        is_last = runner.is_last
        target = self.targets[mb] if is_last and self.targets else None
        if self._plain:  # the common case: straight to the stage
            output = runner.forward(mb, args, target, self.training, kwargs, wants)
            if self.training:
                self._log(_F)  # ActivationCount.record(F)
        else:
            if self.rng is not None:
                with self.rng.forward(stage, mb):  # a recompute's checkpoint keeps the state seeded here
                    output = self._run_forward(runner, mb, args, target, kwargs, wants)
            else:
                output = self._run_forward(runner, mb, args, target, kwargs, wants)
            if self.training:
                self.activations.record(_F, (stage, mb, chain) in self.saved.recomputed)
        if is_last:
            return
        if runner.next_local:
            self._handed[Action(stage + 1, RECV_F, mb, chain)] = as_tuple(output)
        else:
            self._outbox[Action(stage, SEND_F, mb, chain)] = _sendable(output, runner.name)

    def _run_forward(self, runner: StageRunner, mb: int, args: tuple, target: Any, kwargs: dict,
                     wants: tuple[bool, ...] | None) -> Any:
        if self.saved.active:  # recompute, offload, counting: the inputs want a gradient as the header says
            return self.saved.forward(runner, mb, args, target, self.training, kwargs, wants)
        return runner.forward(mb, args, target, self.training, kwargs, wants)

    def _input(self, stage: int, chain: int, mb: int) -> tuple[tuple, tuple[bool, ...] | None]:
        """A later stage's input and which of its tensors want a gradient: from the stage before on this rank,
        those that carry one; from a peer, those its producer made with one (learned with the shapes)."""
        key = Action(stage, RECV_F, mb, chain)
        handed = self._handed.pop(key, None)
        if handed is not None:
            return handed, tuple([isinstance(t, torch.Tensor) and t.requires_grad for t in handed])
        return self._received(key), self.caches.wants_grad.get(key)

    def _backward(self, stage: int, mb: int, chain: int = 0) -> None:
        plain = self._plain
        if not plain:
            self.saved.wait((stage, mb, chain))
        runner = self.runners.get((stage, chain)) or self.runner(stage, chain)
        input_grads = runner.backward(mb, None if runner.is_last else self._take(RECV_B, stage, chain, mb))
        if not runner.is_first:
            self._hand_back(runner, input_grads, mb)
        self._log(_B)  # ActivationCount.record(B)
        if not plain and self.saved.tracked:
            self.saved.backward_done((stage, mb, chain))

    def _backward_input(self, stage: int, mb: int, chain: int = 0) -> None:
        self.saved.wait((stage, mb, chain))
        runner = self.runners.get((stage, chain)) or self.runner(stage, chain)
        self._hand_back(runner, runner.backward_input(mb, self._output_grads(runner, mb)), mb)
        self.activations.backward_input()
        if self.saved.counter is not None:  # what its plan holds until the W, counted with the saved tensors
            self.saved.input_done((stage, mb, chain), runner.weight_plan(mb))
        if self.observers:
            note = runner.note(mb)
            if note:  # the split did something else than split (a compiled region): the trace says what
                for observer in self.observers:
                    getattr(observer, "annotate", _no_note)(note)

    def _backward_weight(self, stage: int, mb: int, chain: int = 0) -> None:
        self.runner(stage, chain).backward_weight(mb)
        self.activations.backward_weight()
        if self.saved.tracked:
            self.saved.backward_done((stage, mb, chain))

    def _recompute(self, stage: int, mb: int, chain: int = 0) -> None:
        if self._offload_waits:
            self._wait_offload(stage, "R", mb, chain)
        self.saved.recompute(self.runner(stage, chain), mb)
        self.activations.record(ActionKind.R)

    def _offload(self, stage: int, mb: int, chain: int = 0) -> None:
        self.saved.offload(self.runner(stage, chain), mb)
        self.activations.record(ActionKind.OFFLOAD)

    def _reload(self, stage: int, mb: int, chain: int = 0) -> None:
        if self._offload_waits:
            self._wait_offload(stage, "RELOAD", mb, chain)
        self.saved.reload(self.runner(stage, chain), mb)
        self.activations.record(ActionKind.RELOAD)

    def _reduce_grad(self, stage: int) -> None:
        replicas = [r for (s, _), r in self.runners.items() if s == stage]
        if not replicas:
            raise PipelineError(f"rank {self.rank} holds no replica of stage {stage}")
        if not self.training or not any(r.states for r in replicas):
            return
        pending = sorted(m for r in replicas for m in r.states)
        if pending:
            raise PipelineError(f"rank {self.rank}: REDUCE_GRAD of stage {stage} with backward still pending "
                                f"for microbatches {pending}")

    # -- communication -----------------------------------------------------------------

    def _post(self, comms: tuple[Comm, ...]) -> None:
        if len(comms) == 1 and comms[0][1] in SENDS:  # a send alone (never early; eval keeps SEND_F's)
            if self.training or comms[0][1] is SEND_F:
                self._sent.append(self.transport.post(self._send_transfers(comms[0]), GroupLabel(comms)))
            return
        if self._early or not self.training:  # eval keeps the forward's; the early receives are posted already
            early, training = self._early, self.training
            comms = tuple([c for c in comms if c not in early and (training or c[1] in FORWARD_COMMS)])
            if not comms:
                return
        if len(comms) == 1 and comms[0][1] in SENDS:  # what is left of a group whose receives went early
            self._sent.append(self.transport.post(self._send_transfers(comms[0]), GroupLabel(comms)))
            return
        label = GroupLabel(comms)
        transfers: list[Transfer] = []
        receives = []
        for comm in comms:
            if comm[1] in SENDS:
                transfers += self._send_transfers(comm)
            else:
                receives.append(comm)
        if not receives:
            self._sent.append(self.transport.post(transfers, label))
            return
        if not self.caches.knows_all(receives, self.training):
            self._post_sends(transfers, label)
            for comm in receives:  # one by one: a peer's header and data come in this order
                self._post_receives([comm], [], label)
        else:
            self._post_receives(receives, transfers, label)

    def _post_sends(self, transfers: list[Transfer], label: GroupLabel) -> None:
        if transfers:
            self._sent.append(self.transport.post(transfers, label))

    def _post_receives(self, receives: list[Comm], transfers: list[Transfer], label: GroupLabel) -> None:
        """Post ``receives`` (and the group's send ``transfers``) as one batch."""
        sends = bool(transfers)
        arriving = []
        for comm in receives:
            tensors = self._receive_buffers(comm, label)
            peer = self.caches.peer(comm, self.info)
            transfers += [Transfer(False, t, peer) for t in tensors]
            arriving.append((comm, tensors))
        if not transfers and not arriving:
            return  # (a receive of no tensors, an integer-only activation's gradient, is posted empty)
        posted = self.transport.post(transfers, label)
        if sends:
            self._sent.append(posted)
        for comm, tensors in arriving:
            self._pending[comm] = (posted, tensors)

    # -- after the program -----------------------------------------------------------

    def begin_program(self) -> None:
        """The rank's program starts now (its end is ``finish``'s)."""
        self._plain = self.rng is None and not self.saved.active
        for observer in self.observers:
            observer.begin_program()

    def finish(self) -> None:
        """Wait for every send and check that nothing the schedule moved was left behind."""
        for observer in self.observers:
            observer.begin_finish()
        for posted in self._sent:
            posted.wait()
        for observer in self.observers:
            observer.end_finish()
        if not self._pending and not self._outbox and not (
                self.training and any(r.states for r in self.runners.values())):
            return
        leftovers = [f"{a.kind} {a.stage}:{a.microbatch}" for a in (*self._pending, *self._outbox)]
        if self.training:
            leftovers += [f"{r.name} microbatch {m}" for r in self.runners.values() for m in r.states]
        if leftovers:
            raise PipelineError(f"rank {self.rank}: the schedule left work unfinished: {', '.join(leftovers[:8])}")

    # -- helpers ---------------------------------------------------------------------

    def runner(self, stage: int, chain: int = 0) -> StageRunner:
        """The replica of ``stage`` in ``chain`` on this rank."""
        runner = self.runners.get((stage, chain))
        if runner is None:
            raise PipelineError(f"rank {self.rank} holds no replica of stage {stage} in chain {chain}")
        return runner

    def _local(self, stage: int, chain: int) -> bool:
        return self.info.rank_of(stage, chain) == self.rank

    def _output_grads(self, runner: StageRunner, mb: int) -> tuple | None:
        if runner.is_last:
            return None
        return self._take(RECV_B, runner.stage, runner.chain, mb)

    def _take(self, kind: ActionKind, stage: int, chain: int, mb: int) -> tuple:
        key = Action(stage, kind, mb, chain)
        handed = self._handed.pop(key, None)
        if handed is not None:
            return handed
        return self._received(key)

    def _received(self, key: Action) -> tuple:
        """The tensors of the posted receive ``key``, once they have landed."""
        entry = self._pending.pop(key, None)
        if entry is None:
            what = "input" if key.kind == RECV_F else "output gradient"
            raise PipelineError(f"rank {self.rank}: the {what} of stage {key.stage} microbatch {key.microbatch} was "
                                f"never received (no {key} posted before it is used)")
        posted, tensors = entry
        if not self.observers:
            posted.wait_received()  # not the group's sends: they are waited in finish()
            return tensors
        stage, kind, mb, chain = key
        assert mb is not None  # a receive names its microbatch
        for observer in self.observers:
            observer.begin_wait(kind, stage, mb, chain)
        posted.wait_received()
        for observer in self.observers:
            observer.end_wait(kind, stage, mb, chain)
        return tensors

    def _hand_back(self, runner: StageRunner, input_grads: tuple, mb: int) -> None:
        if runner.is_first:
            return
        if runner.previous_local:
            self._handed[Action(runner.stage - 1, RECV_B, mb, runner.chain)] = input_grads
        else:
            self._outbox[Action(runner.stage, SEND_B, mb, runner.chain)] = input_grads

    def _send_transfers(self, comm: Comm) -> list[Transfer]:
        """What a send moves: the tensors ``forward``/``backward`` left in the outbox (an activation's
        shapes first, the first time it crosses)."""
        caches = self.caches
        peer = caches.peer(comm, self.info)
        tensors = self._outbox.pop(comm, None)
        if tensors is None:
            what = "forward" if comm[1] is SEND_F else "backward"
            raise PipelineError(f"rank {self.rank}: {comm} before the {what} that produces it")
        if comm[1] is SEND_B:
            return [Transfer(True, t, peer) for t in caches.gradients_to_send(comm, tensors, self.transport.device)]
        if len(tensors) == 1:  # one tensor (most activations): as below, without the sequences
            tensor = tensors[0]
            sent = tensor.detach().contiguous()
            header = caches.header_to_send(comm, (sent,), self.rank, self.transport.device,
                                           (tensor.requires_grad,) if self.training else None)
            if header is None:
                return [Transfer(True, sent, peer)]
            return [Transfer(True, header, peer), Transfer(True, sent, peer)]
        carried = tuple([t.requires_grad for t in tensors]) if self.training else None
        tensors = tuple([t.detach().contiguous() for t in tensors])
        header = caches.header_to_send(comm, tensors, self.rank, self.transport.device, carried)
        if header is None:  # every step after the first
            return [Transfer(True, t, peer) for t in tensors]
        return [Transfer(True, header, peer)] + [Transfer(True, t, peer) for t in tensors]

    def _receive_buffers(self, comm: Comm, label: GroupLabel) -> tuple[torch.Tensor, ...]:
        device = self.transport.device
        if comm.kind == RECV_F:
            if not self.caches.known(comm, self.training):
                self._receive_header(comm, label)
            return self.caches.buffers(comm, device)
        runner, mb = self.runner(comm.stage, comm.chain), comm.microbatch
        assert mb is not None, "a communication names its microbatch"
        return self.caches.gradient_buffers(comm, runner.output_metas(mb), device)

    def _receive_header(self, comm: Comm, label: GroupLabel) -> None:
        """First time only: wait for the shapes the peer sends ahead of the activation."""
        header = empty_header(self.transport.device)
        peer = self.caches.peer(comm, self.info)
        self.transport.post([Transfer(False, header, peer)], HeaderLabel(label)).wait()
        self.caches.learn(comm, decode_header(header), self.training)


_GROUPS: dict[tuple, tuple[Comm, ...]] = {}  # a post's tokens -> its actions, parsed once a process


def posted(comms: tuple, rank: int) -> tuple[Comm, ...]:
    """The communication actions a ``post(...)`` names: each its torch token (``'1SEND_B0'``: parsed once
    a process and kept in ``_GROUPS``, so a post of a generated rank function costs one lookup), or each an
    action (``send_f(1, 0)``, modules generated before). Anything else, or a token of no communication
    action, is refused naming the rank."""
    if not comms:
        raise PipelineError(f"rank {rank}: post(): a post names at least one communication action")
    if all(type(comm) is Action and comm[1] in COMM_KINDS for comm in comms):
        return comms
    if not all(type(comm) is str for comm in comms):
        raise PipelineError(f"rank {rank}: post{comms!r}: a post names its communication actions all by their "
                            f"torch tokens ('1SEND_B0') or all as send_f(...) and its kin make them")
    try:
        group = tuple(map(parse_action, comms))
    except ValueError as error:
        raise PipelineError(f"rank {rank}: post{comms!r}: {error}") from None
    for comm, token in zip(group, comms):
        if comm[1] not in COMM_KINDS:
            raise PipelineError(f"rank {rank}: post{comms!r}: {token!r} is a {comm[1].value}, not a communication "
                                f"action (SEND_F, RECV_F, SEND_B, RECV_B)")
    _GROUPS[comms] = group
    return group


class GroupLabel:
    """A communication group as its text (``[1RECV_F3 1SEND_B2]``), built only when an error names it."""

    __slots__ = ("comms",)

    def __init__(self, comms: tuple[Comm, ...]):
        self.comms = comms

    def __str__(self) -> str:
        return "[" + " ".join(map(str, self.comms)) + "]"


class HeaderLabel:
    __slots__ = ("group",)

    def __init__(self, group: GroupLabel):
        self.group = group

    def __str__(self) -> str:
        return f"shapes ahead of {self.group}"


class ShapeCache:
    """What a pipeline learns once and keeps across steps: each communication's peer, the shapes
    exchanged on the first step, and the receive buffers reused on every later step."""

    def __init__(self) -> None:
        self._sent: dict[tuple, tuple[TensorMeta, ...]] = {}
        self._received: dict[tuple, tuple[TensorMeta, ...]] = {}
        self._buffers: dict[tuple, tuple[torch.Tensor, ...]] = {}
        self._peers: dict[Comm, int] = {}
        # a received activation's tensors that want a gradient, where some do not (the rest: every float)
        self.wants_grad: dict[tuple, tuple[bool, ...]] = {}
        self._zeros: dict[TensorMeta, torch.Tensor] = {}  # the gradients of inputs that got none, sent as zeros
        self._early: dict[bool, tuple] = {}  # per mode: (version, receives, plan, its set) (``early_plan``)
        # activations announced (sends) or learned (receives) by an eval only: no gradient flags yet, so the
        # first training step announces them again, flags and all (``header_to_send``, ``known``)
        self._untrained: set[tuple] = set()

    def peer(self, comm: Comm, info: ScheduleInfo) -> int:
        peer = self._peers.get(comm)
        if peer is None:
            peer = self._peers[comm] = info.rank_of(peer_stage(comm), comm.chain)
        return peer

    def known(self, key: tuple, training: bool = False) -> bool:
        """The shapes of ``key`` are known (and, in a training step, which of its tensors carry a gradient)."""
        return key in self._received and not (training and key in self._untrained)

    def early_plan(self, receives: tuple[Comm, ...], info: ScheduleInfo,
                   training: bool) -> tuple[tuple[Comm, int, GroupLabel], ...]:
        """The receives ``semantics.early_receives`` lets go ahead of the program, with their peers and the
        labels that name them in errors: worked out again only when a shape or a buffer was learned since (keys
        are only ever added)."""
        version = (len(self._received), len(self._buffers), len(self._untrained))
        cached = self._early.get(training)
        if cached is not None and cached[0] == version and cached[1] is receives:
            return cached[2]
        wanted = receives if training else tuple(c for c in receives if c.kind in FORWARD_COMMS)
        ready = self.has_buffers if not training or not self._untrained else (
            lambda comm: self.has_buffers(comm) and comm not in self._untrained)  # a header goes first
        early = early_receives(wanted, lambda comm: self.peer(comm, info), ready)
        plan = tuple((comm, self.peer(comm, info), GroupLabel((comm,))) for comm in map(Action._make, early))
        self._early[training] = (version, receives, plan, frozenset(comm for comm, _, _ in plan))
        return plan

    def early_set(self, training: bool) -> frozenset:
        """The receives of the last ``early_plan`` of this mode, as a set."""
        return self._early[training][3]

    def has_buffers(self, comm: Comm) -> bool:
        """A buffer for ``comm``'s data is known (its shapes learned, or a gradient's buffer made on a step before)."""
        return comm in self._buffers or comm in self._received

    def knows_all(self, receives: list[Comm], training: bool = False) -> bool:
        """Every receive's shapes are known (gradients' always are: they are the outputs' shapes)."""
        return all(self.known(c, training) for c in receives if c.kind == RECV_F)

    def learn(self, key: tuple, metas: tuple[TensorMeta, ...], training: bool = True) -> None:
        """The shapes a header announced (in a training step: with which tensors carry a gradient)."""
        self._received[key] = metas
        self.wants_grad.pop(key, None)
        if not all(m.requires_grad for m in metas):
            self.wants_grad[key] = tuple(m.requires_grad for m in metas)
        if training:
            self._untrained.discard(key)
        else:
            self._untrained.add(key)

    def header_to_send(self, key: Comm, tensors: tuple[torch.Tensor, ...], rank: int,
                       device: torch.device, carried: tuple[bool, ...] | None = None) -> torch.Tensor | None:
        """The shapes header of an activation sent for the first time (``None`` later, when the
        activation is checked against the shapes sent then). ``carried``: which tensors carry a gradient
        (a training step's; ``None``, an eval's: announced as all wanting one, which is never wrong)."""
        announced = self._sent.get(key)
        if announced is not None and len(announced) == 1 == len(tensors):  # one tensor, every later step
            tensor, meta = tensors[0], announced[0]
            if tensor.shape == meta.shape and tensor.dtype == meta.dtype and (carried is None or (
                    (meta.requires_grad or not carried[0]) and key not in self._untrained)):
                return None
        if announced is None:
            return self._announce(key, tensors, carried, device)
        if len(announced) != len(tensors) or any(
                t.shape != m.shape or t.dtype != m.dtype for t, m in zip(tensors, announced)):
            stage, mb = key.stage, key.microbatch
            metas = tuple(TensorMeta.of(t) for t in tensors)
            raise PipelineError(
                f"rank {rank}: the output of stage {stage} microbatch {mb} changed shape since the first step "
                f"({_shapes(announced)} then {_shapes(metas)}); a pipeline keeps one shape per microbatch"
            )
        if carried is not None and any(now and not m.requires_grad for now, m in zip(carried, announced)):
            index = next(i for i, (now, m) in enumerate(zip(carried, announced)) if now and not m.requires_grad)
            raise PipelineError(
                f"rank {rank}: tensor {index} of the output of stage {key.stage} microbatch {key.microbatch} "
                "carries a gradient now and did not at the first step, so the next stage would compute none for "
                "it; a pipeline keeps which of an activation's tensors carry gradients as it keeps their shapes "
                "(the next step learns both anew)")
        if carried is not None and key in self._untrained:  # an eval's shapes: now their gradient flags too
            return self._announce(key, tensors, carried, device)
        return None

    def _announce(self, key: Comm, tensors: tuple[torch.Tensor, ...], carried: tuple[bool, ...] | None,
                  device: torch.device) -> torch.Tensor:
        flags = carried if carried is not None else (True,) * len(tensors)
        metas = self._sent[key] = tuple(TensorMeta.of(t, flag) for t, flag in zip(tensors, flags))
        if carried is None:
            self._untrained.add(key)
        else:
            self._untrained.discard(key)
        return encode_header(metas, device)

    def buffers(self, key: tuple, device: torch.device) -> tuple[torch.Tensor, ...]:
        cached = self._buffers.get(key)
        if cached is None:
            cached = self._buffers[key] = tuple(meta.empty(device) for meta in self._received[key])
        return cached

    def gradient_buffers(self, key: tuple, outputs: tuple[torch.Tensor, ...], device: torch.device) -> tuple:
        cached = self._buffers.get(key)
        if cached is None or len(cached) != len(outputs) or any(
                c.shape != o.shape or c.dtype != o.dtype for c, o in zip(cached, outputs)):
            cached = self._buffers[key] = tuple(torch.empty(o.shape, dtype=o.dtype, device=device) for o in outputs)
        return cached

    def gradients_to_send(self, key: tuple, grads: tuple, device: torch.device) -> tuple[torch.Tensor, ...]:
        """The input gradients of the floating-point inputs, one per such input in order (``grads``
        holds one for each; zeros where an input got none)."""
        stage, _, mb, chain = key
        metas = self._received.get((stage, RECV_F, mb, chain))  # a plain tuple hashes as the Action
        if metas is None:
            raise PipelineError(f"stage {stage} sends a gradient for microbatch {mb} it never received")
        if len(grads) == 1 and len(metas) == 1 and grads[0] is not None and metas[0].dtype.is_floating_point:
            return (grads[0].contiguous(),)  # one input, a float one
        floats = [m for m in metas if m.dtype.is_floating_point]
        return tuple([g.contiguous() if g is not None else self._zeros_like(m, device) for g, m in zip(grads, floats)])

    def _zeros_like(self, meta: TensorMeta, device: torch.device) -> torch.Tensor:
        """Zeros of ``meta``'s shape, made once (only ever sent: nothing writes them)."""
        zeros = self._zeros.get(meta)
        if zeros is None:
            zeros = self._zeros[meta] = torch.zeros(meta.shape, dtype=meta.dtype, device=device)
        return zeros


def _sendable(output: Any, stage_name: str) -> tuple[torch.Tensor, ...]:
    """The output's tensors, as the stage made them (detached when sent, which reads whether each carries
    a gradient)."""
    tensors = as_tuple(output)
    if not all(isinstance(t, torch.Tensor) for t in tensors):
        kinds = ", ".join(type(t).__name__ for t in tensors)
        raise PipelineError(f"{stage_name} returned ({kinds}); an activation sent to another rank must be "
                            "a tensor or a tuple of tensors")
    return tensors


def _shapes(metas: tuple[TensorMeta, ...]) -> str:
    return ", ".join(f"{list(m.shape)} {str(m.dtype).removeprefix('torch.')}" for m in metas)
