"""A failed step leaves every rank able to step again: what each step starts with.

``connect`` at ``make_pipeline`` gives the pipeline its own gloo group (a failure never touches the
caller's). ``StepStart(info, rank).begin(transport, caches, refusal)`` at the start of every step: two words to and
from each neighbouring rank (``neighbours``) saying whether this rank's last step failed and whether it
refuses this one (``refusal``, a tensor whose rows do not split like the batch: its neighbours refuse with
it). Where a step failed, the neighbours meet in a fresh gloo group and forget the activation shapes they
learned. ``failed`` marks this rank's step as failed and closes its connections, so a neighbour waiting
for it fails at once, not at its timeout; a rank whose own code failed leaves a record on the default
store first (``tell``), and a rank whose wait failed raises what the record says (``told_of``: a
``PeerStageError`` naming the rank, stage, microbatch and action). Requires every rank to call ``step``/``eval`` the
same number of times (refused calls included: each call is a tag). On gloo a failure is recovered when
every rank failed the step or neighbours a rank that did; NCCL matches by order, and a failed step leaves
its group unusable. When, and why it is enough: ``docs/runtime-internals.md`` (Transport and recovery).
"""

from __future__ import annotations

import json
import secrets
from datetime import timedelta

import torch
import torch.distributed as dist

from pipeforge.runtime.context import ScheduleInfo, ShapeCache
from pipeforge.runtime.p2p import PipelineError, PipelineUsageError, Transfer, Transport
from pipeforge.runtime.stage import PeerStageError, StageError


def connect(transport: Transport, info: ScheduleInfo, group=None) -> None:
    """The pipeline's own gloo group (``Transport.reconnect``), so a step that fails, its timeouts and the
    connections it closes never touch the caller's groups. Its name, and that of the groups it later
    reconnects in, is its members' global ranks and a random number rank 0 sends the others (on the
    caller's group: the first exchange of ``make_pipeline``)."""
    if not transport.reconnectable:
        return
    members = dist.get_process_group_ranks(group) if group is not None else range(dist.get_world_size())
    word = torch.tensor([secrets.randbits(62) if transport.rank == 0 else 0], dtype=torch.int64)
    if transport.rank == 0:
        transport.exchange([Transfer(True, word, peer) for peer in range(1, info.ranks)], "the pipeline's name")
    else:
        transport.exchange([Transfer(False, word, 0)], "the pipeline's name")
    transport.name = f"pipeforge/pipeline/{'-'.join(map(str, members))}/{word.item():x}"
    transport.reconnect(f"{transport.name}/built", info.ranks, _rendezvous(transport), "at make_pipeline")


def neighbours(info: ScheduleInfo, rank: int) -> list[int]:
    """The ranks ``rank`` greets: those it exchanges activations or their gradients with (a stage's either
    side, either chain), and every rank holding no stage (which greets every rank), so that a failure
    reaches every rank a reconnection needs."""
    idle = {r for r in range(info.ranks) if not info.held(r)}
    if rank in idle:
        return [r for r in range(info.ranks) if r != rank]
    peers = set(idle)
    for stage, chain in info.held(rank):
        for other in (stage - 1, stage + 1):
            if 0 <= other < info.stages and info.rank_of(other, chain) != rank:
                peers.add(info.rank_of(other, chain))
    return sorted(peers)


class StepStart:
    """What a rank remembers between steps about its failures, and the greeting each step begins with."""

    def __init__(self, info: ScheduleInfo, rank: int):
        self.info = info
        self.rank = rank
        self.peers = neighbours(info, rank)
        self.failed_last = False
        self.begun = False  # this call's communication began (what a failure must clean up after)

    def begin(self, transport: Transport, caches: ShapeCache, refusal: str | None = None) -> ShapeCache:
        """The greeting, a fresh group if a rank failed; the shape cache the step uses. ``refusal``: why this
        rank refuses the step (its arguments): it raises it, and its neighbours refuse with it."""
        self.begun = True
        if not self.peers:
            self.failed_last = False
            return self._refuse(refusal, []) or caches
        mine = torch.tensor([int(self.failed_last), int(refusal is not None)], dtype=torch.int64,
                            device=transport.device)
        theirs = {peer: torch.zeros_like(mine) for peer in self.peers}
        transfers = [t for peer in self.peers
                     for t in (Transfer(True, mine, peer), Transfer(False, theirs[peer], peer))]
        try:
            transport.exchange(transfers, "the start of the step")
            broken = False
        except PipelineError:
            if not transport.reconnectable:
                raise
            transport.abandon()
            broken = True
        refused = [peer for peer, word in theirs.items() if not broken and word[1].item()]
        if self.failed_last or broken or any(word[0].item() for word in theirs.values()):
            if transport.reconnectable:
                transport.close_pairs(self.peers)  # a neighbour still waiting on the old group learns now
                transport.reconnect(f"{transport.name}/step/{transport.tag}", self.info.ranks, _rendezvous(transport))
            self.failed_last = False
            caches = ShapeCache()
        return self._refuse(refusal, refused) or caches

    def _refuse(self, refusal: str | None, refused: list[int]) -> None:
        """Raise this rank's refusal, or a neighbour's; nothing was left in flight (``begun`` is cleared)."""
        if refusal is None and not refused:
            return
        self.begun = False
        if refusal is not None:
            raise PipelineUsageError(refusal)
        raise PipelineUsageError(f"rank {self.rank}: rank {refused[0]} refused this "
                                 "step for its arguments (its error names the argument)")

    def failed(self, transport: Transport, error: BaseException | None = None) -> PeerStageError | None:
        """The step failed on this rank with ``error``: what it left in flight is abandoned, the connections to
        the neighbours closed (a neighbour waiting for this rank fails now, not at its timeout); the next step
        starts afresh. A rank whose own code failed (a ``StageError``, anything but a communication's
        ``PipelineError``) first leaves a record of it on the store (``tell``); a rank whose wait failed reads
        the records of the step and returns the ``PeerStageError`` to raise instead (``told``)."""
        transport.abandon()
        told = None
        if error is not None and transport.reconnectable and transport.name:
            if isinstance(error, StageError) or not isinstance(error, PipelineError):
                tell(transport, error)
            elif isinstance(error, PipelineError) and not isinstance(error, PeerStageError):
                told = told_of(transport, self.info.ranks, error)
        transport.close_pairs(self.peers)  # after the record: a peer woken by it finds the record there
        self.failed_last = True
        return told


def _records(transport: Transport):
    return dist.PrefixStore(f"{transport.name}/failed/{transport.tag}", dist.distributed_c10d._get_default_store())


def tell(transport: Transport, error: BaseException) -> None:
    """This step's record of this rank's failure on the default store: its rank and, for a ``StageError``,
    stage, chain, microbatch and action. The ``check`` after the ``set`` is a round trip, so the record
    is in the store before this rank closes its connections."""
    record = {"rank": transport.rank, "message": str(error) if isinstance(error, StageError)
              else f"rank {transport.rank}: {type(error).__name__}: {error}"}
    if isinstance(error, StageError):
        record.update(stage=error.stage, chain=error.chain, microbatch=error.microbatch, action=error.action)
    try:
        store = _records(transport)
        store.set(str(transport.rank), json.dumps(record))
        store.check([str(transport.rank)])
    except Exception:  # noqa: BLE001, S110 (a store that is gone: the peers still fail, with their own error)
        pass


def told_of(transport: Transport, ranks: int, error: PipelineError) -> PeerStageError | None:
    """The error this rank raises when another rank left a record of this step (the lowest such rank)."""
    try:
        store = _records(transport)
        for rank in range(ranks):
            if rank != transport.rank and store.check([str(rank)]):
                return PeerStageError(transport.rank, json.loads(store.get(str(rank))), error)
    except Exception:  # noqa: BLE001, S110 (no store: this rank's own error stands)
        pass
    return None


def _rendezvous(transport: Transport) -> timedelta:
    """How long a rank waits for the others to join a fresh group: a peer may still be waiting out its own
    timeout before it notices the failure."""
    wait = transport.timeout.total_seconds() if transport.timeout is not None else 600.0
    return timedelta(seconds=max(60.0, 3 * wait))
