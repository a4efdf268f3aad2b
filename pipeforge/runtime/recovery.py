"""A failed step leaves every rank able to step again: what each step starts with.

A script may catch a step's error (a bad batch, a peer that timed out) and call
``step`` again on every rank. What makes the next step clean:

- on gloo every step posts under its own tag (``Transport.begin_step``): what
  a failed step left posted is never matched by a later step's messages, and
  it is kept alive (``Transport.abandon``: gloo may still write into it);
- every step starts with one word to and from each neighbouring rank: whether
  this rank's last step failed. A rank whose last step failed, or that hears
  so from a neighbour, or whose greeting fails (gloo closes a connection on a
  timeout), joins its neighbours in a fresh gloo group for the pipeline
  (``Transport.reconnect``, a rendezvous on the store named by the step) and
  forgets the activation shapes it learned, so shapes go again with the next
  activation each way.

Every rank must call ``step``/``eval`` the same number of times (a step's tag is
its count), as a pipeline needs anyway; a call refused for its arguments before it
communicated does not count. A failure is recovered when every rank
failed the step or neighbours a rank that did: always on 2 ranks, and on more
whenever the failure stalled the others into timing out (a pipeline's ranks
wait on each other, so a rank that fails mid-step stalls every rank). NCCL
matches messages by order, not by tag: there a failed step leaves the group as
it is.
"""

from __future__ import annotations

import itertools
from datetime import timedelta

import torch

from pipeforge.runtime.context import ScheduleInfo, ShapeCache
from pipeforge.runtime.p2p import PipelineError, Transfer, Transport

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
        self.peers = neighbours(info, rank)
        self.name = f"pipeforge/pipeline/{next(_PIPELINES)}/{info.name}"
        self.failed_last = False
        self.begun = False  # this call's communication began (what a failure must clean up after)

    def begin(self, transport: Transport, caches: ShapeCache) -> ShapeCache:
        """A new tag, the greeting, a fresh group if a rank failed; the shape cache the step uses."""
        transport.begin_step()
        self.begun = True
        if not self.peers:
            self.failed_last = False
            return caches
        mine = torch.tensor([int(self.failed_last)], dtype=torch.int64, device=transport.device)
        theirs = {peer: torch.zeros_like(mine) for peer in self.peers}
        transfers = [t for peer in self.peers for t in (Transfer(True, mine, peer), Transfer(False, theirs[peer], peer))]
        try:
            transport.exchange(transfers, "the start of the step")
            broken = False
        except PipelineError:
            if not transport.reconnectable:
                raise
            transport.abandon()
            broken = True
        if not (self.failed_last or broken or any(word.item() for word in theirs.values())):
            return caches
        if transport.reconnectable:
            transport.reconnect(f"{self.name}/step/{transport.tag}", self.info.ranks, _rendezvous(transport))
        self.failed_last = False
        return ShapeCache()

    def failed(self, transport: Transport) -> None:
        """The step failed on this rank: what it left in flight is abandoned; the next step starts afresh."""
        transport.abandon()
        self.failed_last = True


def _rendezvous(transport: Transport) -> timedelta:
    """How long a rank waits for the others to join a fresh group: a peer may still be waiting out its own
    timeout before it notices the failure."""
    wait = transport.timeout.total_seconds() if transport.timeout is not None else 600.0
    return timedelta(seconds=max(60.0, 3 * wait))
