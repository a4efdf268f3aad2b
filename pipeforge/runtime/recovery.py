"""A failed step leaves every rank able to step again, and every rank learns that it failed.

``connect`` at ``make_pipeline`` gives the pipeline its own gloo group (a failure never touches the
caller's). ``StepStart(info, rank)``: ``begin(transport, caches, refusal)`` starts every step with two words
to and from each neighbour (``neighbours``): whether this rank's last step failed, whether it refuses this
one (``refusal``, anything wrong with its call's arguments: its record goes on the store first, and the
neighbours raise a ``PeerRefusedError`` quoting it). Where a step failed, the ranks meet in a fresh gloo
group and forget the activation shapes they learned. ``failed`` abandons what is in flight and closes this
rank's connections, so a rank waiting for it fails at once; a rank whose own code failed leaves a record
first (``tell``), one whose wait failed raises what the record says (``told_of``). ``end`` is the step-end
agreement on the store: a rank whose step ran to its end raises the failure of any other. Every rank calls
``step``/``eval`` the same number of times (each call is a tag). NCCL matches by order: a failed step
leaves its group unusable. When, and why it is enough: ``docs/runtime-internals.md`` (Transport and recovery).
"""

from __future__ import annotations

import json
import secrets
from datetime import timedelta

import torch
import torch.distributed as dist

from pipeforge.runtime.context import ScheduleInfo, ShapeCache
from pipeforge.runtime.p2p import PipelineError, PipelineUsageError, Transfer, Transport, backend_reason
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
    """What a rank remembers between steps about its failures, the greeting each step begins with and the
    agreement it ends with (``end``)."""

    def __init__(self, info: ScheduleInfo, rank: int):
        self.info = info
        self.rank = rank
        self.peers = neighbours(info, rank)
        self.others = [r for r in range(info.ranks) if r != rank]
        self.failed_last = False
        self.begun = False  # this call's communication began (what a failure must clean up after)
        self.told = False  # this call's record is on the store already
        self.agreed: tuple[int, ...] = ()  # the tags of the last two step-end agreements (``end``)

    def begin(self, transport: Transport, caches: ShapeCache, refusal: BaseException | None = None) -> ShapeCache:
        """The greeting, a fresh group if a rank failed; the shape cache the step uses. ``refusal``: why this
        rank refuses the step (its arguments): its record goes on the store first, then it is raised, and its
        neighbours raise a ``PeerRefusedError`` with its message (``docs/runtime-internals.md``)."""
        self.begun, self.told = True, False
        if refusal is not None:
            self.tell(transport, refusal)
        if not self.peers:
            self.failed_last = False
            if refusal is not None:
                raise refusal
            return caches
        theirs, broken = self._greet(transport, refusal is not None)
        if self.failed_last or broken or any(word[0].item() for word in theirs.values()):
            if transport.reconnectable:
                transport.close_pairs(self.peers)  # a neighbour still waiting on the old group learns now
                transport.reconnect(f"{transport.name}/step/{transport.tag}", self.info.ranks, _rendezvous(transport))
            self.failed_last = False
            caches = ShapeCache()
            if broken:  # the words did not cross: again, in the fresh group (a refusal must reach the neighbours)
                theirs, _ = self._greet(transport, refusal is not None)
        refused = [peer for peer, word in theirs.items() if word[1].item()]
        if refusal is not None:
            raise refusal
        if refused:
            raise self.refused_by(transport, refused[0])
        return caches

    def _greet(self, transport: Transport, refuses: bool) -> tuple[dict[int, torch.Tensor], bool]:
        """Two words to and from each neighbour: whether this rank's last step failed, whether it refuses this
        one; and whether the exchange broke (a neighbour closed its connections after a failed step)."""
        mine = torch.tensor([int(self.failed_last), int(refuses)], dtype=torch.int64, device=transport.device)
        theirs = {peer: torch.zeros_like(mine) for peer in self.peers}
        transfers = [t for peer in self.peers
                     for t in (Transfer(True, mine, peer), Transfer(False, theirs[peer], peer))]
        try:
            transport.exchange(transfers, "the start of the step")
        except PipelineError:
            if not transport.reconnectable:
                raise
            transport.abandon()
            return {peer: torch.zeros_like(mine) for peer in self.peers}, True
        return theirs, False

    def tell(self, transport: Transport, error: BaseException, refused: bool = True) -> None:
        """This rank's record of the step's failure on the store (once a call), before any peer can wake."""
        if not self.told and transport.reconnectable and transport.name:
            tell(transport, error, refused)
        self.told = True

    def refused_by(self, transport: Transport, peer: int, where: str = "greeting") -> PipelineUsageError:
        """What this rank raises when ``peer`` refused the step (as ``where`` said): its record's message where
        it left one."""
        here = PipelineError(f"rank {self.rank}: rank {peer}'s {where}")
        told = told_of(transport, self.info.ranks, here, first=peer)
        if isinstance(told, PipelineUsageError):
            return told
        return PipelineUsageError(f"rank {self.rank}: rank {peer} refused this step for its arguments (its error "
                                  "names the argument)")

    def failed(self, transport: Transport, error: BaseException | None = None) -> PeerStageError | None:
        """The step failed on this rank with ``error``: what it left in flight is abandoned, the connections to
        every other rank closed (a rank waiting for this one fails now, not at its timeout); the next step
        starts afresh. A rank whose own code failed (a ``StageError``, a refusal of its arguments, anything
        but a communication's ``PipelineError``) first leaves a record of it on the store (``tell``); a rank
        whose wait failed reads the records of the step and returns the ``PeerStageError`` to raise instead."""
        transport.abandon()
        told = None
        if error is not None and transport.reconnectable and transport.name:
            if isinstance(error, PeerStageError):
                pass
            elif isinstance(error, (StageError, PipelineUsageError)) or not isinstance(error, PipelineError):
                self.tell(transport, error, refused=isinstance(error, PipelineUsageError))
            else:
                told = told_of(transport, self.info.ranks, error)
        transport.close_pairs(self.others)  # after the record: a peer woken by it finds the record there
        self.failed_last = True
        return told

    def end(self, transport: Transport, failed: bool) -> None:
        """The step-end agreement: every rank adds its outcome to one counter on the store. A rank whose step
        failed leaves at once; one whose step ran waits until every rank has added its own, and raises the
        failure of any other rank (a ``PeerStageError`` from its record), so no rank returns normally from a
        step that failed elsewhere. Three store round trips on most ranks, two on the last to arrive (the
        critical one); the first to arrive deletes the keys of the agreement before the last, which every rank
        has read (each added to the last one since)."""
        if self.info.ranks == 1 or not transport.reconnectable or not transport.name:
            return
        store = _end_store(transport, transport.tag)
        try:
            value = store.add("n", 1 + FAILED * failed)
            if value % FAILED == self.info.ranks:  # the last to arrive: release the others
                store.set("done", str(value))
            else:
                if value % FAILED == 1 and len(self.agreed) == 2:  # the first: it has time to tidy up
                    self._forget(transport, self.agreed[0])
                if not failed:
                    value = self._wait(transport, store)
        except PipelineError:
            self.failed_last = True
            raise
        except Exception as error:  # noqa: BLE001 (the store is gone: a failed step raises its own error)
            if failed:
                return
            self.failed_last = True
            raise PipelineError(f"rank {self.rank}: the agreement at the end of the step failed: "
                                f"{backend_reason(error)}") from error
        finally:
            self.agreed = (*self.agreed[-1:], transport.tag)
        if failed or value < FAILED:
            return
        self.failed_last = True  # every rank meets in a fresh group at the next step's start
        here = PipelineError(f"rank {self.rank}: the end of its step, which ran to its end")
        told = told_of(transport, self.info.ranks, here)
        if told is not None:
            raise told from here
        raise PipelineError(f"rank {self.rank}: the step failed on {value // FAILED} other rank(s) (their errors "
                            "name the cause); this rank's step ran to its end")

    def _wait(self, transport: Transport, store) -> int:
        wait = transport.timeout
        try:
            store.wait(["done"], wait) if wait is not None else store.wait(["done"])
        except Exception as error:  # noqa: BLE001 (a timeout: some rank never finished its step)
            arrived = store.add("n", 0) % FAILED
            limit = f" within {wait.total_seconds():g} s" if wait is not None else ""
            raise PipelineError(f"rank {self.rank}: at the end of the step, {arrived} of {self.info.ranks} ranks "
                                f"had finished it{limit}; a rank may have died or hung ({backend_reason(error)})"
                                ) from error
        return int(store.get("done"))

    def _forget(self, transport: Transport, tag: int) -> None:
        old = _end_store(transport, tag)
        old.delete_key("n")
        old.delete_key("done")


FAILED = 1 << 32  # what a rank whose step failed adds to the step-end counter (beside the one every rank adds)


def _end_store(transport: Transport, tag: int):
    return dist.PrefixStore(f"{transport.name}/end/{tag}", dist.distributed_c10d._get_default_store())


def _records(transport: Transport):
    return dist.PrefixStore(f"{transport.name}/failed/{transport.tag}", dist.distributed_c10d._get_default_store())


def tell(transport: Transport, error: BaseException, refused: bool = False) -> None:
    """This step's record of this rank's failure on the default store: its rank and, for a ``StageError``,
    stage, chain, microbatch and action; ``refused``: the rank refused the step's arguments. The ``check``
    after the ``set`` is a round trip, so the record is in the store before this rank closes its
    connections or greets its neighbours."""
    message = str(error)
    if not isinstance(error, PipelineError):
        message = f"rank {transport.rank}: {type(error).__name__}: {error}"
    record: dict = {"rank": transport.rank, "message": message}
    if isinstance(error, StageError):
        record.update(stage=error.stage, chain=error.chain, microbatch=error.microbatch, action=error.action)
    elif refused:
        record["refused"] = True
    try:
        store = _records(transport)
        store.set(str(transport.rank), json.dumps(record))
        store.check([str(transport.rank)])
    except Exception:  # noqa: BLE001, S110 (a store that is gone: the peers still fail, with their own error)
        pass


def told_of(transport: Transport, ranks: int, error: PipelineError, first: int | None = None) -> PeerStageError | None:
    """The error this rank raises when another rank left a record of this step (``first``'s, else the lowest
    such rank's)."""
    order = [first] if first is not None else []
    order += [rank for rank in range(ranks) if rank != first]
    try:
        store = _records(transport)
        for rank in order:
            if rank != transport.rank and store.check([str(rank)]):
                return PeerStageError.of(transport.rank, json.loads(store.get(str(rank))), error)
    except Exception:  # noqa: BLE001, S110 (no store: this rank's own error stands)
        pass
    return None


def _rendezvous(transport: Transport) -> timedelta:
    """How long a rank waits for the others to join a fresh group: a peer may still be waiting out its own
    timeout before it notices the failure."""
    wait = transport.timeout.total_seconds() if transport.timeout is not None else 600.0
    return timedelta(seconds=max(60.0, 3 * wait))
