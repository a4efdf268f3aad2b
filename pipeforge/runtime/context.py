"""What a generated rank function calls: one method per kind of action.

A generated module holds one function per rank, ``rank_3(ctx)``, whose body is
the rank's steps in order; ``ctx`` is a ``RankContext``. Data moves like this:

- ``forward(s, m)`` takes its input from the batch (stage 0), from the previous
  stage on this rank (handed over, no communication) or from the receive that
  ``post`` posted earlier (waited here, where the data is used);
- ``post(...)`` issues one communication group as one ``batch_isend_irecv``;
  sends take what ``forward`` / ``backward`` left in the outbox;
- ``backward`` / ``backward_input`` / ``backward_weight`` mirror it for gradients.

In eval mode backward actions and backward communication are skipped: a valid
schedule stays valid without them (the forward transfers keep their order).
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Iterator

import torch

from pipeforge.ir import Action, ActionKind
from pipeforge.runtime.memory import ActivationCount
from pipeforge.runtime.microbatch import as_tuple
from pipeforge.runtime.p2p import (
    PipelineError, Posted, TensorMeta, Transfer, Transport, decode_header, empty_header, encode_header,
)
from pipeforge.runtime.stage import StageRunner
from pipeforge.semantics import SENDS, peer_stage

SEND_F, RECV_F, SEND_B, RECV_B = ActionKind.SEND_F, ActionKind.RECV_F, ActionKind.SEND_B, ActionKind.RECV_B
Comm = Action  # what send_f/recv_f/send_b/recv_b return and post takes: the communication action itself


@dataclass(frozen=True)
class ScheduleInfo:
    """The facts about a schedule the runtime needs (written by codegen as literals)."""

    name: str
    ranks: int
    stages: int
    microbatches: int
    placements: tuple[tuple[int, ...], ...]

    def rank_of(self, stage: int, chain: int = 0) -> int:
        return self.placements[chain][stage]

    def stages_of(self, rank: int) -> tuple[int, ...]:
        """The stages ``rank`` runs (in either chain), ascending: the keys its ``stage_modules`` needs."""
        if not 0 <= rank < self.ranks:
            raise PipelineError(f"rank {rank} is out of range: schedule {self.name!r} runs on ranks 0..{self.ranks - 1}")
        return tuple(sorted({stage for stage, _ in self.held(rank)}))

    def held(self, rank: int) -> tuple[tuple[int, int], ...]:
        """Every (stage, chain) whose replica lives on ``rank``."""
        return tuple(
            (stage, chain)
            for chain, placement in enumerate(self.placements)
            for stage, owner in enumerate(placement)
            if owner == rank
        )


class RankContext:
    """The state of one rank during one ``step`` or ``eval``."""

    def __init__(self, info: ScheduleInfo, rank: int, runners: dict[tuple[int, int], StageRunner],
                 transport: Transport, caches: "ShapeCache"):
        self.info = info
        self.rank = rank
        self.runners = runners
        self.transport = transport
        self.caches = caches
        self.training = True
        self.inputs: list[tuple[tuple[Any, ...], dict[str, Any]]] = []  # stage 0's (args, kwargs) per microbatch
        self.stage_inputs: dict[int, list[dict[str, Any]]] = {}  # a stage's keyword inputs per microbatch
        self.targets: list[Any] = []
        self._handed: dict[tuple[str, int, int, int], Any] = {}
        self._outbox: dict[tuple[str, int, int, int], tuple[torch.Tensor, ...]] = {}
        self._pending: dict[tuple[str, int, int, int], tuple[Posted, tuple[torch.Tensor, ...]]] = {}
        self._sent: list[Posted] = []
        self.activations = ActivationCount()  # what simulate's memory model counts (O(1) per action)

    # -- the actions a generated rank function calls -------------------------------

    def forward(self, stage: int, mb: int, chain: int = 0) -> None:
        runner = self._runner(stage, chain)
        args, kwargs = self._forward_input(stage, mb, chain)
        own = self.stage_inputs.get(stage)
        if own is not None:
            kwargs = {**kwargs, **own[mb]}
        target = self.targets[mb] if runner.is_last and self.targets else None
        output = runner.forward(mb, args, target, self.training, kwargs)
        if self.training:
            self.activations.forward()
        if runner.is_last:
            return
        if self._local(stage + 1, chain):
            self._handed[Action(stage + 1, RECV_F, mb, chain)] = as_tuple(output)
        else:
            self._outbox[Action(stage, SEND_F, mb, chain)] = _sendable(output, runner.name)

    def backward(self, stage: int, mb: int, chain: int = 0) -> None:
        if self.training:
            runner = self._runner(stage, chain)
            self._hand_back(runner, runner.backward(mb, self._output_grads(runner, mb)), mb)
            self.activations.backward()

    def backward_input(self, stage: int, mb: int, chain: int = 0) -> None:
        if self.training:
            runner = self._runner(stage, chain)
            self._hand_back(runner, runner.backward_input(mb, self._output_grads(runner, mb)), mb)
            self.activations.backward_input()

    def backward_weight(self, stage: int, mb: int, chain: int = 0) -> None:
        if self.training:
            self._runner(stage, chain).backward_weight(mb)
            self.activations.backward_weight()

    def reduce_grad(self, stage: int, chain: int = 0) -> None:
        """The stage's gradients are complete on this rank (every replica of it here: REDUCE_GRAD
        names a stage, not a chain). They are summed across chains and scaled after the program."""
        replicas = [r for (s, _), r in self.runners.items() if s == stage]
        if not replicas:
            raise PipelineError(f"rank {self.rank} holds no replica of stage {stage}")
        pending = sorted(m for r in replicas for m in r.states)
        if self.training and pending:
            raise PipelineError(f"rank {self.rank}: REDUCE_GRAD of stage {stage} with backward still pending "
                                f"for microbatches {pending}")

    @contextmanager
    def overlap(self) -> Iterator[None]:
        """An overlap step: its actions are issued back to back, none waits for another."""
        with self.activations.overlap():
            yield

    def send_f(self, stage: int, mb: int, chain: int = 0) -> Comm:
        return Action(stage, SEND_F, mb, chain)

    def recv_f(self, stage: int, mb: int, chain: int = 0) -> Comm:
        return Action(stage, RECV_F, mb, chain)

    def send_b(self, stage: int, mb: int, chain: int = 0) -> Comm:
        return Action(stage, SEND_B, mb, chain)

    def recv_b(self, stage: int, mb: int, chain: int = 0) -> Comm:
        return Action(stage, RECV_B, mb, chain)

    def post(self, *comms: Comm) -> None:
        """Post one communication group together; receives are waited where used."""
        if not self.training:
            comms = tuple(c for c in comms if c.kind in (SEND_F, RECV_F))
        if not comms:
            return
        label = "[" + " ".join(map(str, comms)) + "]"
        self._exchange_headers(comms, label)
        transfers, received = [], {}
        for comm in comms:
            tensors = self._comm_tensors(comm)
            peer = self._peer(comm)
            transfers += [Transfer(comm.kind in SENDS, t, peer) for t in tensors]
            received[comm] = tensors
        posted = self.transport.post(transfers, label)
        for comm in comms:
            if comm.kind in SENDS:
                self._sent.append(posted)
            else:
                self._pending[comm] = (posted, received[comm])

    # -- after the program -----------------------------------------------------------

    def finish(self) -> None:
        """Wait for every send and check that nothing the schedule moved was left behind."""
        for posted in self._sent:
            posted.wait()
        leftovers = [f"{a.kind} {a.stage}:{a.microbatch}" for a in (*self._pending, *self._outbox)]
        leftovers += [f"{r.name} microbatch {m}" for r in self.runners.values() for m in r.states] if self.training else []
        if leftovers:
            raise PipelineError(f"rank {self.rank}: the schedule left work unfinished: {', '.join(leftovers[:8])}")

    # -- helpers ---------------------------------------------------------------------

    def _runner(self, stage: int, chain: int) -> StageRunner:
        runner = self.runners.get((stage, chain))
        if runner is None:
            raise PipelineError(f"rank {self.rank} holds no replica of stage {stage} in chain {chain}")
        return runner

    def _local(self, stage: int, chain: int) -> bool:
        return self.info.rank_of(stage, chain) == self.rank

    def _peer(self, comm: Comm) -> int:
        return self.info.rank_of(peer_stage(comm), comm.chain)

    def _forward_input(self, stage: int, mb: int, chain: int) -> tuple[tuple[Any, ...], dict[str, Any]]:
        if stage == 0:
            if not self.inputs:
                raise PipelineError(f"rank {self.rank} holds stage 0 and needs the batch: pass inputs to step()")
            return self.inputs[mb]
        return self._take(RECV_F, stage, chain, mb), {}

    def _output_grads(self, runner: StageRunner, mb: int) -> tuple | None:
        if runner.is_last:
            return None
        return self._take(RECV_B, runner.stage, runner.chain, mb)

    def _take(self, kind: ActionKind, stage: int, chain: int, mb: int) -> tuple:
        key = Action(stage, kind, mb, chain)
        if key in self._handed:
            return self._handed.pop(key)
        if key not in self._pending:
            what = "input" if kind == RECV_F else "output gradient"
            raise PipelineError(f"rank {self.rank}: the {what} of stage {stage} microbatch {mb} was never received "
                                f"(no {stage}{kind}{mb} posted before it is used)")
        posted, tensors = self._pending.pop(key)
        posted.wait_received()  # not the group's sends: they are waited in finish()
        return tensors

    def _hand_back(self, runner: StageRunner, input_grads: tuple, mb: int) -> None:
        if runner.is_first:
            return
        if self._local(runner.stage - 1, runner.chain):
            self._handed[Action(runner.stage - 1, RECV_B, mb, runner.chain)] = input_grads
        else:
            self._outbox[Action(runner.stage, SEND_B, mb, runner.chain)] = input_grads

    def _comm_tensors(self, comm: Comm) -> tuple[torch.Tensor, ...]:
        key = comm
        if comm.kind == SEND_F:
            tensors = self._outbox.pop(key, None)
            if tensors is None:
                raise PipelineError(f"rank {self.rank}: {comm} before the forward that produces it")
            self.caches.check_sent(key, tensors, self.rank)
            return tensors
        if comm.kind == SEND_B:
            grads = self._outbox.pop(key, None)
            if grads is None:
                raise PipelineError(f"rank {self.rank}: {comm} before the backward that produces it")
            return self.caches.gradients_to_send(key, grads, self.transport.device)
        if comm.kind == RECV_F:
            return self.caches.buffers(key, self.transport.device)
        runner = self._runner(comm.stage, comm.chain)
        return self.caches.gradient_buffers(key, runner.output_metas(comm.microbatch), self.transport.device)

    def _exchange_headers(self, comms: tuple[Comm, ...], label: str) -> None:
        """First time only: shapes travel ahead of forward activations."""
        transfers, arriving = [], []
        for comm in comms:
            key = comm
            if comm.kind == SEND_F and not self.caches.announced(key):
                metas = [TensorMeta.of(t) for t in self._outbox.get(key, ())]
                self.caches.announce(key, metas)
                transfers.append(Transfer(True, encode_header(metas, self.transport.device), self._peer(comm)))
            elif comm.kind == RECV_F and not self.caches.known(key):
                header = empty_header(self.transport.device)
                transfers.append(Transfer(False, header, self._peer(comm)))
                arriving.append((key, header))
        if not transfers:
            return
        self.transport.exchange(transfers, f"shapes ahead of {label}")
        for key, header in arriving:
            self.caches.learn(key, decode_header(header))


class ShapeCache:
    """Shapes exchanged on the first step, and receive buffers reused on every later step."""

    def __init__(self) -> None:
        self._sent: dict[tuple, tuple[TensorMeta, ...]] = {}
        self._received: dict[tuple, tuple[TensorMeta, ...]] = {}
        self._buffers: dict[tuple, tuple[torch.Tensor, ...]] = {}

    def announced(self, key: tuple) -> bool:
        return key in self._sent

    def announce(self, key: tuple, metas: list[TensorMeta]) -> None:
        self._sent[key] = tuple(metas)

    def known(self, key: tuple) -> bool:
        return key in self._received

    def learn(self, key: tuple, metas: tuple[TensorMeta, ...]) -> None:
        self._received[key] = metas

    def check_sent(self, key: tuple, tensors: tuple[torch.Tensor, ...], rank: int) -> None:
        metas = tuple(TensorMeta.of(t) for t in tensors)
        if metas != self._sent[key]:
            stage, mb = key.stage, key.microbatch
            raise PipelineError(
                f"rank {rank}: the output of stage {stage} microbatch {mb} changed shape since the first step "
                f"({_shapes(self._sent[key])} then {_shapes(metas)}); a pipeline keeps one shape per microbatch"
            )

    def buffers(self, key: tuple, device: torch.device) -> tuple[torch.Tensor, ...]:
        if key not in self._buffers:
            self._buffers[key] = tuple(meta.empty(device) for meta in self._received[key])
        return self._buffers[key]

    def gradient_buffers(self, key: tuple, outputs: tuple[torch.Tensor, ...], device: torch.device) -> tuple:
        metas = tuple(TensorMeta.of(t) for t in outputs)
        cached = self._buffers.get(key)
        if cached is None or tuple(TensorMeta.of(t) for t in cached) != metas:
            cached = self._buffers[key] = tuple(meta.empty(device) for meta in metas)
        return cached

    def gradients_to_send(self, key: tuple, grads: tuple, device: torch.device) -> tuple[torch.Tensor, ...]:
        """The input gradients of the floating-point inputs (zeros where an input got none)."""
        stage, _, mb, chain = key
        metas = self._received.get(Action(stage, RECV_F, mb, chain))
        if metas is None:
            raise PipelineError(f"stage {stage} sends a gradient for microbatch {mb} it never received")
        floats = [(g, m) for g, m in zip(grads, metas) if m.dtype.is_floating_point]
        return tuple(g.contiguous() if g is not None else torch.zeros(m.shape, dtype=m.dtype, device=device)
                     for g, m in floats)


def _sendable(output: Any, stage_name: str) -> tuple[torch.Tensor, ...]:
    tensors = as_tuple(output)
    if not all(isinstance(t, torch.Tensor) for t in tensors):
        kinds = ", ".join(type(t).__name__ for t in tensors)
        raise PipelineError(f"{stage_name} returned ({kinds}); an activation sent to another rank must be "
                            "a tensor or a tuple of tensors")
    return tuple(t.detach().contiguous() for t in tensors)


def _shapes(metas: tuple[TensorMeta, ...]) -> str:
    return ", ".join(f"{list(m.shape)} {str(m.dtype).removeprefix('torch.')}" for m in metas)
