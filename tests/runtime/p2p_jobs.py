"""The worker of ``test_runtime_p2p``'s direction test: two ranks connect a transport, send each other a tensor
through it, and receive it on the group ``Transport.group_of`` names for that direction."""

from __future__ import annotations

from datetime import timedelta

import torch

from pipeforge.runtime.p2p import Transfer, Transport


def directions(rank: int, nproc: int, name: str) -> dict:
    transport = Transport(None, rank, timedelta(seconds=30), torch.device("cpu"))
    transport.reconnect(name, nproc, timedelta(seconds=60))
    peer = 1 - rank
    mine = torch.tensor([float(rank + 1)] * 3)
    theirs = torch.zeros(3)
    sent = transport.post([Transfer(True, mine, peer)], "a tensor to the peer")
    transport.group_of(peer, rank).recv([theirs], peer, transport.tag).wait(timedelta(seconds=30))
    sent.wait()
    return {"received": theirs.tolist(), "apart": transport.group_of(0, 1) is not transport.group_of(1, 0)}
