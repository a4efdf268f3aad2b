"""A failed step leaves every rank able to step again: what each step starts with.

``StepStart(info, rank).begin(transport, caches, refusal)`` at the start of every step: two words to and
from each neighbouring rank (``neighbours``) saying whether this rank's last step failed and whether it
refuses this one (``refusal``, a tensor whose rows do not split like the batch: its neighbours refuse with
it). Where a step failed, the neighbours meet in a fresh gloo group and forget the activation shapes they
learned. ``failed`` marks this rank's step as failed. Requires every rank to call ``step``/``eval`` the
same number of times (refused calls included: each call is a tag). On gloo a failure is recovered when
every rank failed the step or neighbours a rank that did; NCCL matches by order, and a failed step leaves
its group unusable. When, and why it is enough: ``docs/runtime-internals.md`` (Transport and recovery).
"""

from __future__ import annotations

import itertools
from datetime import timedelta

import torch

from pipeforge.runtime.context import ScheduleInfo, ShapeCache
from pipeforge.runtime.p2p import PipelineError, PipelineUsageError, Transfer, Transport

_PIPELINES = itertools.count()  # every rank builds its pipelines in one order: the n-th is named alike on each


def neighbours(info: ScheduleInfo, rank: int) -> list[int]:
    """The ranks ``rank`` exchanges activations or their gradients with (a stage's either side, either chain)."""
    peers = set()
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
        self.name = f"pipeforge/pipeline/{next(_PIPELINES)}/{info.name}"
        self.failed_last = False
        self.begun = False  # this call's communication began (what a failure must clean up after)

    def begin(self, transport: Transport, caches: ShapeCache, refusal: str | None = None) -> ShapeCache:
        """The greeting, a fresh group if a rank failed; the shape cache the step uses. ``refusal``: why this
        rank refuses the step (its arguments): it raises it, and its neighbours refuse with it."""
        self.begun = True
        if not self.peers:
            self.failed_last = False
            return self._refuse(refusal, [])
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
                transport.reconnect(f"{self.name}/step/{transport.tag}", self.info.ranks, _rendezvous(transport))
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

    def failed(self, transport: Transport) -> None:
        """The step failed on this rank: what it left in flight is abandoned; the next step starts afresh."""
        transport.abandon()
        self.failed_last = True


def _rendezvous(transport: Transport) -> timedelta:
    """How long a rank waits for the others to join a fresh group: a peer may still be waiting out its own
    timeout before it notices the failure."""
    wait = transport.timeout.total_seconds() if transport.timeout is not None else 600.0
    return timedelta(seconds=max(60.0, 3 * wait))
