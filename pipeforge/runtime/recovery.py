"""A failed step leaves every rank able to step again, and every rank learns that it failed.

``connect`` at ``make_pipeline`` gives the pipeline its own gloo group (a failure never touches the
caller's). ``StepStart(info, rank)``: ``begin(transport, caches, refusal)`` starts a step with two words to
and from each neighbour (``neighbours``: whether this rank's last step failed, whether it refuses this one),
unless the last call's agreement heard every rank's step run; a refusal's record goes on the store first,
and the others raise a ``PeerRefusedError`` quoting it. Where a step failed, the ranks meet in a fresh gloo
group (a rank that is gone named at once) and forget their activation shapes. ``failed`` abandons what
is in flight and closes this rank's connections, so a rank waiting for it fails at once; a rank whose own
code failed leaves a record first (``tell``), one whose wait failed raises what the record says
(``told_of``). ``end`` is the step-end agreement (one word per rank through rank 0, on a group of its
own): a rank whose step ran to its end raises the failure of any other. Every rank calls ``step``/``eval``
the same number of times (each call is a tag). NCCL matches by order: a failed step leaves it unusable.
When, and why it is enough: ``docs/runtime-internals.md`` (Transport and recovery).
"""

from __future__ import annotations

import json
import secrets
import time
from datetime import timedelta

import torch
import torch.distributed as dist

from pipeforge.runtime.context import ScheduleInfo, ShapeCache
from pipeforge.runtime.p2p import (
    GREETING_TAGS,
    MAX_TAG,
    PipelineError,
    PeerGroup,
    PipelineUsageError,
    Transfer,
    Transport,
    _gloo_group,
    are_gone,
    backend_reason,
)
from pipeforge.runtime.stage import PeerStageError, StageError


def connect(transport: Transport, info: ScheduleInfo, group=None) -> PeerGroup | None:
    """The pipeline's own gloo group (``Transport.reconnect``), so a step that fails, its timeouts and the
    connections it closes never touch the caller's groups. Its name, and that of the groups it later
    reconnects in, is its members' global ranks and a random number rank 0 sends the others (on the
    caller's group: the first exchange of ``make_pipeline``). Returns the pipeline's liveness group
    (``StepStart.alive``): nothing is sent or waited on it, so only a process that is gone closes its
    connections."""
    if not transport.reconnectable:
        return None
    members = dist.get_process_group_ranks(group) if group is not None else range(dist.get_world_size())
    word = torch.tensor([secrets.randbits(62) if transport.rank == 0 else 0], dtype=torch.int64)
    if transport.rank == 0:
        transport.exchange([Transfer(True, word, peer) for peer in range(1, info.ranks)], "the pipeline's name")
    else:
        transport.exchange([Transfer(False, word, 0)], "the pipeline's name")
    transport.name = f"pipeforge/pipeline/{'-'.join(map(str, members))}/{word.item():x}"
    transport.reconnect(f"{transport.name}/built", info.ranks, _rendezvous(transport), "at make_pipeline")
    if info.ranks < 2:
        return None
    store = dist.PrefixStore(f"{transport.name}/alive", dist.distributed_c10d._get_default_store())
    try:
        return _gloo_group(store, transport.rank, info.ranks, _rendezvous(transport), transport.agreement_group)
    except Exception as error:  # noqa: BLE001
        raise PipelineError(f"rank {transport.rank}: connecting the pipeline's ranks at make_pipeline failed: "
                            f"{backend_reason(error)}") from error


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
        self.agreeing = True  # calls end with the agreement (``Pipeline.end_agreement``)
        self._expected: dict | None = None  # this call's step-end receives, by peer (``expect``)
        self._sends: list = []  # the last agreement's sends (``end``)
        self.abandoned: list = []  # what failed calls' agreements left in flight, kept alive
        self.meetings = 0  # the fresh groups this rank has met the others in since make_pipeline (``_meet``)
        self.behind = False  # this call met ranks already at a later call: it fails, without closing or telling
        self.fresh = False  # the last call met the others in a fresh group, behind them: this one starts there
        self.agreed = False  # the last call's agreement heard every rank's step run: this call greets no one
        self.alive: PeerGroup | None = None  # the pipeline's liveness group (``connect``; ``_gone``)
        self._probes: list = []  # the receives ``_gone`` posted on it, kept alive (never waited)
        self.retired: tuple[list, list] = ([], [])  # the last meeting's abandoned and probes (``Transport.retired``)
        self._recorded: list[int] = []  # the steps this rank left a record of since the last meeting (``tell``)
        self._stale: list[int] = []  # those it left before the last meeting: forgotten at the next (``_meet``)

    def begin(self, transport: Transport, caches: ShapeCache, refusal: BaseException | None = None) -> ShapeCache:
        """The greeting, a fresh group if a rank failed; the shape cache the step uses. ``refusal``: why this
        rank refuses the step (its arguments): its record goes on the store first, then it is raised, and its
        neighbours raise a ``PeerRefusedError`` with its message (``docs/runtime-internals.md``)."""
        self.begun, self.told, self.behind = True, False, False
        agreed, self.agreed = self.agreed, False
        if self.fresh:  # met the others in a fresh group at the last call's start: this call greets there
            self.fresh, caches = False, ShapeCache()
        if self._expected is not None:  # a call that ended without its agreement (turned off meanwhile)
            self.abandoned += [work for work, _ in self._expected.values()]
            self._expected = None
        if refusal is not None:
            self.tell(transport, refusal)
        if not self.peers:
            self.failed_last = False
            if refusal is not None:
                raise refusal
            return caches
        if agreed and _agrees(self.info, transport):  # every rank heard every step run: a greeting tells nothing
            self.expect(transport)
            if refusal is not None:  # its record is on the store: failed() closes its connections, so a peer
                raise refusal  # waiting for it raises its refusal now, and one that ran learns at its step's end
            return caches
        # a failure known here, with the agreement on: every rank knows it, or (a word this rank missed) steps on
        # without a greeting and learns from this call's word and the closed connections; so no greeting first
        known = self.failed_last and self.agreeing and transport.reconnectable and _agrees(self.info, transport)
        theirs, broken = ({}, False) if known else self._greet(transport, refusal is not None)
        if self.failed_last or broken or any(word[0].item() for word in theirs.values()):
            if transport.reconnectable:
                if self.agreeing and (known or broken and not self.failed_last):  # a rank stepping on in the old
                    self.end(transport, failed=True)  # group learns at its step's end, or when a wait breaks
                transport.close_pairs(self.others if known else self.peers)  # one still waiting there learns now
                ahead = self._meet(transport)
                if ahead:  # they failed this call already and start the next one in the fresh group
                    self.behind, self.fresh, self.failed_last = True, True, False
                    raise refusal if refusal is not None else self._behind_error(transport, ahead, broken)
            self.failed_last = False
            caches = ShapeCache()
            if transport.reconnectable:  # every rank met here greets again: a neighbour's greeting may have broken
                theirs, broken = self._greet(transport, refusal is not None)
                if broken and refusal is None:
                    raise PipelineError(f"rank {self.rank}: the greeting at the start of the step broke again in "
                                        f"the fresh group (rank(s) {', '.join(map(str, self.peers))}"
                                        f"{_within(transport)}); every rank meets in a fresh group at the next step")
        refused = [peer for peer, word in theirs.items() if word[1].item()]
        self.expect(transport)  # the step-end agreement's receives, in the group the step posts in
        if refusal is not None:
            raise refusal
        if refused:
            raise self.refused_by(transport, refused[0])
        return caches

    def _meet(self, transport: Transport) -> list[int]:
        """Join every rank in a fresh group for the pipeline (``Transport.reconnect``), named by how many this
        rank has met in (every rank meets in every one, so the names agree whichever call each rank is in);
        the ranks already at a later call than this one (their step tags, left on the store before joining)."""
        self.meetings += 1
        name = f"{transport.name}/fresh/{self.meetings}"
        store = dist.PrefixStore(f"{name}/at", dist.distributed_c10d._get_default_store())
        try:
            store.set(str(self.rank), str(transport.tag))
            self._await(store, _rendezvous(transport))
        except PipelineError:
            raise
        except Exception as error:  # noqa: BLE001 (the store is gone: its host died, rank 0 where torchrun is not used)
            gone = self._gone(self.others)
            raise PipelineError(f"rank {self.rank}: the store the pipeline's ranks meet on after a failed step is "
                                f"gone ({backend_reason(error)})" + (f"; {are_gone(gone)}" if gone else "")
                                ) from error
        transport.reconnect(name, self.info.ranks, _rendezvous(transport), gone=self._gone)
        # what the agreements and probes of the groups left posted is kept as long as those groups (``retired``)
        self.retired, self.abandoned, self._probes = (self.abandoned, self._probes), [], []
        if self.meetings > 1:  # every rank came here after reading the last meeting's keys: this rank's go
            _forget(f"{transport.name}/fresh/{self.meetings - 1}", self.rank)
        for tag in self._stale:  # its records of the steps before the last meeting, read by every rank since
            _forget_record(transport, tag)
        self._stale, self._recorded = self._recorded, []
        tags = {rank: int(store.get(str(rank))) for rank in self.others}  # each set before its rank joined
        return [rank for rank, tag in tags.items() if 0 < (tag - transport.tag) % MAX_TAG < MAX_TAG // 2]

    def _await(self, store: dist.Store, limit: timedelta) -> None:
        """Until every other rank has come to the meeting (its tag on ``store``); a rank still missing whose
        process is gone (``_gone``) fails the meeting at once, named, instead of at ``limit``."""
        now = time.monotonic()
        deadline, probe_at, every = now + limit.total_seconds(), now, POLL_SECONDS
        missing = list(self.others)
        while True:
            missing = [rank for rank in missing if not store.check([str(rank)])]
            if not missing:
                return
            # each look for a gone rank leaves one receive posted per live rank until the next meeting:
            # looked for at once, then ever less often (at most every PROBE_SECONDS), not at every poll
            if time.monotonic() >= probe_at:
                gone = self._gone(missing)
                if gone:
                    raise PipelineError(f"rank {self.rank}: {are_gone(gone)} while the pipeline's ranks met after "
                                        "a failed step; the pipeline cannot step without them")
                probe_at, every = time.monotonic() + every, min(2 * every, PROBE_SECONDS)
            if time.monotonic() > deadline:
                raise PipelineError(f"rank {self.rank}: connecting the pipeline's ranks after a failed step failed "
                                    f"(waited {limit.total_seconds():g} s for every rank): rank(s) "
                                    f"{', '.join(map(str, missing))} never came")
            time.sleep(POLL_SECONDS)

    def _gone(self, ranks: list[int]) -> list[int]:
        """The ranks among ``ranks`` whose process is gone: a receive posted on the liveness group (where
        nothing is sent or waited, so only a closed connection ends one) is refused at once by a closed
        connection, and left pending (kept alive) on a live one."""
        if self.alive is None:
            return []
        gone = []
        for rank in ranks:
            try:
                self._probes.append(self.alive.recv([torch.zeros(1)], rank, 0))
            except Exception:  # noqa: BLE001 (gloo: "Connection closed by peer", "Read error")
                gone.append(rank)
        return gone

    def name_gone(self, transport: Transport, error: PipelineError) -> PeerStageError | None:
        """Where a wait of this rank failed and no rank left a record: the ranks whose process is gone (a closed
        connection, this rank's own or the one a peer closed after its wait on them broke) each get a record
        from this rank, before it closes its connections, so every rank woken by a closed connection names the
        rank that died rather than the peer whose connection closed; the error for the lowest. Where its wait
        broke on a closed connection and no rank looks gone yet, the liveness group is given up to
        ``GONE_SECONDS`` to hear of it (its connections close with the same process)."""
        gone = self._gone(self.others)
        deadline = time.monotonic() + GONE_SECONDS
        while not gone and "closed" in str(error).lower() and time.monotonic() < deadline:
            time.sleep(POLL_SECONDS)
            gone = self._gone(self.others)
        for rank in gone:
            stages = ", ".join(map(str, self.info.stages_of(rank))) or "none"
            tell_gone(transport, rank, f"rank {rank}: its process is gone (it held stage(s) {stages}; rank "
                                       f"{self.rank} found its connections closed)")
        return told_of(transport, self.info.ranks, error) if gone else None

    def _behind_error(self, transport: Transport, ahead: list[int], broken: bool) -> PipelineError:
        """What a rank raises that met the others in a fresh group at the start of a call they had already ended
        failed: the failure a rank left a record of, else what this rank saw."""
        listed = ", ".join(map(str, ahead))
        here = PipelineError(
            f"rank {self.rank}: " + (f"its greeting with rank(s) {', '.join(map(str, self.peers))} at the start "
                                     "of the step broke, and " if broken else "") +
            f"rank(s) {listed} had ended this step failed already; every rank met in a fresh group, where the "
            "next step runs")
        told = told_of(transport, self.info.ranks, here)
        return told if told is not None else here

    def _greet(self, transport: Transport, refuses: bool) -> tuple[dict[int, torch.Tensor], bool]:
        """Two words to and from each neighbour: whether this rank's last step failed, whether it refuses this
        one; and whether the exchange broke (a neighbour closed its connections after a failed step)."""
        mine = torch.tensor([int(self.failed_last), int(refuses)], dtype=torch.int64, device=transport.device)
        theirs = {peer: torch.zeros_like(mine) for peer in self.peers}
        transfers = [t for peer in self.peers
                     for t in (Transfer(True, mine, peer), Transfer(False, theirs[peer], peer))]
        try:  # on a tag of its own: a greeting one rank sends where its neighbour greets no more meets no data
            transport.exchange(transfers, "the start of the step", GREETING_TAGS + transport.tag)
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
            self._recorded.append(transport.tag)
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
        if self.behind:  # the others are in the fresh group already, at the next call: nothing to close or tell
            return None
        if error is not None and transport.reconnectable and transport.name:
            if isinstance(error, PeerStageError):
                pass
            elif isinstance(error, (StageError, PipelineUsageError)) or not isinstance(error, PipelineError):
                self.tell(transport, error, refused=isinstance(error, PipelineUsageError))
            else:
                told = told_of(transport, self.info.ranks, error) or self.name_gone(transport, error)
        transport.close_pairs(self.others)  # after the record: a peer woken by it finds the record there
        self.failed_last = True
        return told

    def expect(self, transport: Transport) -> None:
        """Post this call's step-end receives ahead of its end (once a call; ``end`` posts them where the call
        failed before ``begin`` did): the words then land as soon as they are sent."""
        if self._expected is not None or not self.agreeing or not _agrees(self.info, transport):
            return
        group, tag = transport.agreement_group, transport.tag
        assert group is not None, "_agrees: there is an agreement group"
        sources = self.others if self.rank == ROOT or self.info.ranks <= ALL_TO_ALL else [ROOT]
        words = {peer: torch.zeros(1, dtype=torch.int64) for peer in sources}
        self._expected = {peer: (group.recv([word], peer, tag), word) for peer, word in words.items()}

    def end(self, transport: Transport, failed: bool) -> None:
        """The step-end agreement, on the pipeline's agreement group (``Transport.agreement_group``, which a
        failure never closes) under the call's tag: every rank sends rank 0 one word (1 where its step failed)
        and rank 0 sends every rank the sum (on two ranks each sends the other its word). A rank whose step
        failed sends and leaves at once; one whose step ran waits (within ``timeout``) and raises the failure
        of any other rank (a ``PeerStageError`` from its record), or a ``PipelineError`` where a rank sent
        no word in time, so no rank returns normally from a step that failed elsewhere. Its receives were
        posted at ``begin`` (``expect``), so a word lands as it is sent: two messages on the critical path
        (one on two ranks), no store round trip."""
        if not _agrees(self.info, transport) or self.behind:  # behind: every other rank ended this call already
            return
        value = 0
        try:
            self._settle_sends(transport)
            self.expect(transport)
            value = self._exchange(transport, failed)
        except PipelineError:
            value = UNHEARD
            raise
        except Exception as error:  # noqa: BLE001 (the group is gone: a failed step raises its own error)
            value = UNHEARD
            if failed:
                return
            raise PipelineError(f"rank {self.rank}: the agreement at the end of the step failed: "
                                f"{backend_reason(error)}") from error
        finally:
            if failed or value:  # nothing of it is waited again: kept alive while gloo may still use it
                self.failed_last = True  # every rank meets in a fresh group at the next step's start
                self.abandoned += [work for work, _ in (self._expected or {}).values()] + self._sends
                self._sends = []
            if not failed and value >= UNHEARD:  # a rank that heard every word steps on without a greeting:
                transport.close_pairs(self.others)  # its first wait on this rank breaks, not at its timeout
            self._expected = None
        if failed:
            return
        if value == 0:
            self.agreed = True  # the next call starts without a greeting (``begin``)
            return
        if value >= UNHEARD:
            unheard = PipelineError(f"rank {self.rank}: at the end of the step, {value // UNHEARD} rank(s) sent no word"
                                f"{_within(transport)}; a rank may have died or hung")
            gone = told_of(transport, self.info.ranks, unheard) or self.name_gone(transport, unheard)
            raise gone if gone is not None else unheard
        here = PipelineError(f"rank {self.rank}: the end of its step, which ran to its end")
        told = told_of(transport, self.info.ranks, here)
        if told is not None:
            raise told from here
        raise PipelineError(f"rank {self.rank}: the step failed on {value} other rank(s) (their errors "
                            "name the cause); this rank's step ran to its end")

    def _exchange(self, transport: Transport, failed: bool) -> int:
        """This rank's word out, and (unless it failed) the sum in: failures, plus ``UNHEARD`` for each rank
        not heard from in time. Up to ``ALL_TO_ALL`` ranks every rank tells every other (one message on the
        critical path); beyond, every rank tells rank 0, which answers every rank (two)."""
        group, tag, expected = transport.agreement_group, transport.tag, self._expected
        assert group is not None and expected is not None, "end: _agrees, and the receives are posted (expect)"
        word = _WORDS[failed]
        if self.rank != ROOT and self.info.ranks > ALL_TO_ALL:
            self._sends.append(group.send([word], ROOT, tag))
            if failed:
                return 0
            work, answer = expected[ROOT]
            self._wait(transport, work, ROOT)
            return int(answer.item())
        if self.info.ranks <= ALL_TO_ALL:
            self._send(group, word, self.others, tag)
        total = int(failed)
        if not failed:
            total += self._sum_words(transport, expected)
        if self.info.ranks > ALL_TO_ALL:  # rank 0 answers: at once where its own step failed
            self._send(group, torch.tensor([total]), self.others, tag)
        return 0 if failed else total

    def _send(self, group, word: torch.Tensor, peers: list[int], tag: int) -> None:
        for peer in peers:
            try:
                self._sends.append(group.send([word], peer, tag))
            except Exception:  # noqa: BLE001, S110 (a connection a timeout closed: that peer learns by its own wait)
                pass

    def _sum_words(self, transport: Transport, expected: dict) -> int:
        total = 0
        for peer, (work, word) in expected.items():
            try:
                self._wait(transport, work, peer)
                total += int(word.item())
            except PipelineError:  # rank 0 tells the others, not leaving them to wait out their own timeout
                total += UNHEARD
        return total

    def _wait(self, transport: Transport, work, peer: int) -> None:
        try:
            work.wait(_wait_limit(transport))
        except Exception as error:  # noqa: BLE001 (a timeout, or a closed connection)
            raise PipelineError(f"rank {self.rank}: at the end of the step, no word from rank {peer}"
                                f"{_within(transport)}: {backend_reason(error)}") from error

    def _settle_sends(self, transport: Transport) -> None:
        """The words sent at the last agreement, which every rank took (it ran on every rank: long done)."""
        sends, self._sends = self._sends, []
        for work in sends:
            work.wait(_wait_limit(transport))


ALL_TO_ALL = 2  # up to so many ranks every rank sends every other its step-end word; beyond, through rank 0
ROOT = 0  # the rank that sums the step-end words and answers every rank
GONE_SECONDS = 0.5  # how long a rank whose wait broke on a closed connection gives the liveness group to hear of it
POLL_SECONDS = 0.05  # how often a rank at a meeting looks for the ranks still missing (and first whether they are gone)
PROBE_SECONDS = 1.0  # the longest a rank at a meeting waits between looks for whether the ranks missing are gone
UNHEARD = 1 << 32  # what rank 0 adds to the step-end sum for each rank it did not hear from in time
_WORDS = {False: torch.tensor([0]), True: torch.tensor([1])}  # a rank's step-end word (only ever sent)


def _agrees(info: ScheduleInfo, transport: Transport) -> bool:
    return info.ranks > 1 and transport.agreement_group is not None


def _wait_limit(transport: Transport) -> timedelta:
    """A step-end wait's bound: the pipeline's ``timeout``, else the default store's (what a wait on it had)."""
    if transport.timeout is not None:
        return transport.timeout
    return dist.distributed_c10d._get_default_store().timeout  # type: ignore[attr-defined]  # (a Store has it; its stub not)


def _within(transport: Transport) -> str:
    return f" within {_wait_limit(transport).total_seconds():g} s"


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


def _forget(name: str, rank: int) -> None:
    """This rank's keys of the meeting ``name`` on the default store: its step tag and gloo's addresses of it
    (``<group>/<device>/<rank>``, its one device a group), so a pipeline failing step after step keeps two
    meetings' keys at most."""
    store = dist.distributed_c10d._get_default_store()
    for key in (f"{name}/at/{rank}", *(f"{name}{part}/0/{rank}" for part in ("", "/down", "/end"))):
        try:
            store.delete_key(key)
        except Exception:  # noqa: BLE001, S110 (a store without deletes, or gone: the keys stay)
            pass


def _forget_record(transport: Transport, tag: int) -> None:
    try:
        dist.PrefixStore(f"{transport.name}/failed/{tag}", dist.distributed_c10d._get_default_store()).delete_key(
            str(transport.rank))
    except Exception:  # noqa: BLE001, S110 (a store without deletes, or gone: the record stays)
        pass


def tell_gone(transport: Transport, rank: int, message: str) -> None:
    """This step's record for ``rank``, whose process is gone, left by a rank that found it so (as ``tell``)."""
    try:
        store = _records(transport)
        store.set(str(rank), json.dumps({"rank": rank, "message": message, "gone": True}))
        store.check([str(rank)])
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
