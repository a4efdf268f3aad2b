"""Point-to-point transport between the ranks of one pipeline group.

``Transport.post(transfers, label)`` -> ``Posted``: one communication group of the schedule posted
together (one ``batch_isend_irecv`` on NCCL, the group's own ``send``/``recv`` per tensor on gloo); its
receives are waited where their data is used, its sends at the end of the step (on gloo, messages to a
higher rank and to a lower one each on a group of their own: ``group_of``). Waits carry a timeout,
and every failure (a dead peer, a timeout, a tensor of another shape) is a ``PipelineError`` naming the
rank, the schedule's communication and the peers. ``encode_header``/``decode_header``: the small header
that carries an activation's shapes the first time. On gloo ``begin_step``, ``abandon`` and
``reconnect`` keep a failed step from touching a later one (``recovery.py``). How:
``docs/runtime-internals.md``.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, NamedTuple, Protocol

import torch
import torch.distributed as dist

from pipeforge.errors import PipeforgeError

DTYPES = (
    torch.float32, torch.float64, torch.float16, torch.bfloat16,
    torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool,
)
HEADER_LENGTH = 64
MAX_TAG = 2**30 - 2  # a step's tags wrap here; gloo's tags are int32
GREETING_TAGS = 2**30  # a step's greeting posts under this plus its tag: no data message ever meets a greeting
CLOSING_TAG = 2**31 - 1  # kept for closing connections (close_pairs)


class PipelineError(PipeforgeError, RuntimeError):
    """A pipeline could not run: a peer died or timed out, or shapes or modules do not fit."""

    kind = "runtime"


class PipelineUsageError(PipelineError, ValueError):
    """A pipeline was built or called wrongly; the message names the rank, the stage and the argument."""


@dataclass(frozen=True)
class TensorMeta:
    shape: tuple[int, ...]
    dtype: torch.dtype
    requires_grad: bool = True  # an activation's: whether the receiving stage wants its gradient

    @staticmethod
    def of(tensor: torch.Tensor, requires_grad: bool = True) -> TensorMeta:
        return TensorMeta(tuple(tensor.shape), tensor.dtype, requires_grad)

    def empty(self, device: torch.device) -> torch.Tensor:
        return torch.empty(self.shape, dtype=self.dtype, device=device)


NO_GRAD = 1 << 16  # added to a tensor's dtype code in a header: the sender produced it without a gradient


def encode_header(metas: Sequence[TensorMeta], device: torch.device) -> torch.Tensor:
    """The shapes and dtypes of an activation (and which of its tensors need no gradient) as a fixed-length
    int64 tensor."""
    words = [len(metas)]
    for meta in metas:
        if meta.dtype not in DTYPES:
            raise PipelineError(f"activations of dtype {meta.dtype} cannot be sent (supported: {DTYPES})")
        code = DTYPES.index(meta.dtype) + (0 if meta.requires_grad else NO_GRAD)
        words += [code, len(meta.shape), *meta.shape]
    if len(words) > HEADER_LENGTH:
        raise PipelineError(f"an activation of {len(metas)} tensors is too large to describe in {HEADER_LENGTH} words")
    words += [0] * (HEADER_LENGTH - len(words))
    return torch.tensor(words, dtype=torch.int64, device=device)


def decode_header(header: torch.Tensor) -> tuple[TensorMeta, ...]:
    """The shapes and dtypes ``encode_header`` wrote; anything else is a ``PipelineError``, never an IndexError."""
    words = header.tolist()
    count, position, metas = words[0], 1, []
    if not 0 <= count < HEADER_LENGTH:
        raise PipelineError(f"a shapes header announces {count} tensors: not a header pipeforge wrote")
    for _ in range(count):
        code = words[position] % NO_GRAD if position < len(words) and words[position] >= 0 else -1
        if position + 2 > len(words) or not 0 <= code < len(DTYPES) or words[position] >= 2 * NO_GRAD \
                or words[position + 1] < 0 or position + 2 + words[position + 1] > len(words):
            raise PipelineError(f"a shapes header is malformed at word {position}: not a header pipeforge wrote")
        dtype, ndim = DTYPES[code], words[position + 1]
        shape = tuple(words[position + 2: position + 2 + ndim])
        if any(size < 0 for size in shape):
            raise PipelineError(f"a shapes header gives the negative shape {list(shape)}: not a header pipeforge wrote")
        metas.append(TensorMeta(shape, dtype, words[position] < NO_GRAD))
        position += 2 + ndim
    return tuple(metas)


def empty_header(device: torch.device) -> torch.Tensor:
    return torch.zeros(HEADER_LENGTH, dtype=torch.int64, device=device)


class Transfer(NamedTuple):
    """One tensor to send to, or receive from, a peer (a group rank). A NamedTuple: made for every
    tensor a step moves, where a frozen dataclass's construction costs several times as much."""

    send: bool
    tensor: torch.Tensor
    peer: int


class PeerGroup(Protocol):
    """What posting transfers one by one needs of a group: a ``ProcessGroup``, or a gloo group of its own."""

    def send(self, tensors: list[torch.Tensor], dstRank: int, tag: int) -> Any: ...

    def recv(self, tensors: list[torch.Tensor], srcRank: int, tag: int) -> Any: ...


def _gloo_group(store: dist.Store, rank: int, size: int, timeout: timedelta, beside: PeerGroup | None = None
                ) -> PeerGroup:
    """A gloo group of its own on ``store`` (torch's stubs give its ``Backend`` no send or recv; it has both);
    ``beside``: on that group's gloo devices, so one event-loop thread serves both."""
    if beside is None:
        return dist.ProcessGroupGloo(store, rank, size, timeout)  # type: ignore[return-value]
    options = dist.ProcessGroupGloo._Options()  # type: ignore[attr-defined]  # (torch's stubs lack it; it is there)
    options._devices = beside.options._devices  # type: ignore[attr-defined]
    options._timeout = timeout
    return dist.ProcessGroupGloo(store, rank, size, options)  # type: ignore[return-value]


class Watched(dist.Store):
    """A store gloo's rendezvous waits on (for each rank's address) that looks, while it waits, whether the
    ranks it waits for are gone (``gone``), and fails the wait at once where one is (``failure`` says which),
    instead of at ``timeout``."""

    def __init__(self, inner: dist.Store, timeout: timedelta, gone: Callable[[list[int]], list[int]], who: str):
        super().__init__()
        self.inner, self.limit, self.gone, self.who = inner, timeout, gone, who
        self.failure = ""

    def set(self, key: str, value) -> None:
        self.inner.set(key, value)

    def check(self, keys: list[str]) -> bool:
        return self.inner.check(keys)

    def add(self, key: str, amount: int) -> int:
        return self.inner.add(key, amount)

    def get(self, key: str) -> bytes:
        self.wait([key])
        return self.inner.get(key)

    def wait(self, keys: list[str], timeout: timedelta | None = None) -> None:
        deadline = time.monotonic() + (timeout or self.limit).total_seconds()
        while not self.inner.check(keys):
            waited = [int(part) for key in keys if (part := key.rsplit("/", 1)[-1]).isdigit()]
            gone = self.gone(waited)
            if gone:
                self.failure = f"{self.who}{are_gone(gone)}"
                raise RuntimeError(self.failure)
            if time.monotonic() > deadline:
                raise RuntimeError(f"waited {(timeout or self.limit).total_seconds():g} s for {keys}")
            time.sleep(WATCH_SECONDS)


WATCH_SECONDS = 0.05  # how often a rendezvous on a ``Watched`` store looks for the addresses and the ranks gone


class Posted:
    """The works of one posted batch.

    ``wait_received`` waits only for the batch's receives, where their data is
    used: a send posted in the same batch completes when its peer takes it, and
    waiting for it there would tie this rank's next compute to the peer's
    progress (torch's schedules also wait for sends only at the end of a step).
    ``wait`` waits for everything (sends at the end of a step). Under a backend
    that coalesces a batch into one work (NCCL) both wait for that work.

    Thread-safe: the two halves of an overlap step run on two threads by a custom
    function may wait on one batch (gloo consumes one completion per wait, so a
    second concurrent wait on a receive would never return).
    """

    __slots__ = ("_receives", "_sends", "_transfers", "_arrivals", "label", "_rank", "_timeout", "received", "done",
                 "_lock")
    _receives: Sequence[Any]  # works
    _sends: Sequence[Any]
    _arrivals: Sequence[tuple[torch.Tensor, torch.Tensor]]

    def __init__(self, works: list, transfers: list[Transfer], label: object, rank: int, timeout: timedelta | None,
                 arrivals: Sequence[tuple[torch.Tensor, torch.Tensor]] = ()):
        if len(works) == 1 and len(transfers) == 1:  # one tensor (most of a schedule's messages, on gloo)
            self._receives, self._sends = ([], works) if transfers[0].send else (works, [])
        elif len(works) == len(transfers):  # one work per transfer (gloo): receives can be waited alone
            self._receives = [w for w, t in zip(works, transfers) if not t.send]
            self._sends = [w for w, t in zip(works, transfers) if t.send]
        else:
            self._receives, self._sends = list(works), []
        self._transfers = transfers  # keeps the tensors alive until the batch completes
        self._arrivals = arrivals  # (staging buffer, device buffer) copied once the batch completes
        self.label = label  # anything whose str() names the communication: built only for an error
        self._rank = rank
        self._timeout = timeout
        self.received = not self._receives and not arrivals  # a batch of sends only has nothing to land
        self.done = False
        self._lock = threading.Lock()

    def wait_received(self) -> None:
        """Wait until every receive of the batch has landed (and staged data is in place)."""
        if self.received:
            return
        with self._lock:
            if not self.received:
                self._wait(self._receives)
                for staged, target in self._arrivals:
                    target.copy_(staged)
                self.received = True
                self._receives, self._arrivals = (), ()

    @property
    def settled(self) -> bool:
        """Every work of the batch was waited (none left that could still take or give data)."""
        return self.done or (self.received and not self._sends)

    def wait(self) -> None:
        """Wait for the whole batch: its receives and its sends."""
        if self.done:
            return
        if not self.received:
            self.wait_received()
        with self._lock:
            if not self.done:
                self._wait(self._sends)
                self.done = True
                self._sends, self._transfers = [], []

    def _wait(self, works: Sequence[Any]) -> None:
        try:
            for work in works:
                if self._timeout is None:
                    work.wait()
                else:
                    work.wait(self._timeout)
        except Exception as error:  # noqa: BLE001 (torch raises plain RuntimeError/DistBackendError)
            raise self._failure(error) from error

    def _failure(self, error: Exception) -> PipelineError:
        peers = ", ".join(str(p) for p in sorted({t.peer for t in self._transfers}))
        limit = f" (waits limited to {self._timeout.total_seconds():g} s)" if self._timeout else ""
        return PipelineError(
            f"rank {self._rank}: {self.label} with rank(s) {peers} failed{limit}: {backend_reason(error)}. "
            "A peer rank may have died or hung, or sent a tensor of another shape."
        )


def are_gone(ranks: list[int]) -> str:
    """The words naming ranks whose process is gone (``recovery``'s meetings, a ``Watched`` rendezvous)."""
    return f"rank(s) {', '.join(map(str, ranks))} are gone (their connections closed: the process died)"


def backend_reason(error: Exception) -> str:
    """The first sentence of a backend's error, without its source location (``[.../pair.cc:553]``)."""
    text = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    text = re.sub(r"^\[[^\]]*\]\s*", "", text)
    return text.split(". This is typically")[0].rstrip(". ")


class Transport:
    """Posts batches of transfers on one process group (ranks are group ranks).

    gloo moves host memory only: with gloo and a CUDA device, tensors are staged
    through host copies (sent from a copy, received into one and copied to the
    device buffer when the batch completes). Several ranks can then share one GPU.
    """

    def __init__(self, group, rank: int, timeout: timedelta | None, device: torch.device):
        self.group = group
        self.rank = rank
        self.timeout = timeout
        self.device = device
        gloo = dist.get_backend(group) == "gloo"
        self.staged = device.type != "cpu" and gloo
        # gloo does not coalesce: batch_isend_irecv there is one send/recv per op; call them directly
        self._process_group: PeerGroup | None = (group if group is not None else dist.group.WORLD) if gloo else None
        # gloo, once connected (``reconnect``): messages to a lower rank go on a group of their own, so that no
        # pair's lock is held by a send while the peer's messages for the other direction arrive on it (gloo's
        # event loop spins on a pair whose lock another thread holds: docs/runtime-internals.md)
        self._downward = self._process_group
        self.tag = 0  # make_pipeline's exchanges; every step posts under its own (begin_step)
        self.name = ""  # the pipeline's, for the groups it meets in (``recovery.connect``)
        self.posted: list[Posted] = []  # this step's batches
        self.abandoned: list[Posted] = []  # what failed steps left in flight on the current groups, kept alive
        # the groups the last reconnection left and what was abandoned on them, kept alive while a rank may still
        # be there (until every rank has met in the groups after them: the next reconnection drops them)
        self.retired: tuple[list, list] = ([], [])
        # gloo: the step-end agreement's own group, made with each fresh group
        self.agreement_group: PeerGroup | None = None

    def begin_step(self) -> None:
        """A new step: its own tag (1, 2, ... on every rank alike, as every rank counts its calls)."""
        self.tag = self.tag % MAX_TAG + 1
        self.posted = []

    def abandon(self) -> None:
        """The step failed: what it left in flight is kept alive, never waited again."""
        self.abandoned += [p for p in self.posted if not p.settled]
        self.posted = []

    @property
    def reconnectable(self) -> bool:
        return self._process_group is not None

    def reconnect(self, name: str, size: int, timeout: timedelta, why: str = "after a failed step",
                  gone: Callable[[list[int]], list[int]] | None = None) -> None:
        """Post from now on through fresh gloo groups of the ``size`` ranks, met on the default store
        under ``name`` (every rank passes the same name): one for the messages to a higher rank, one for
        those to a lower rank; the old ones stay alive for what is in flight. make_pipeline connects the
        pipeline's own groups so: a failure never touches the caller's groups. ``gone(ranks)``: those of
        ``ranks`` whose process is gone; while gloo waits for a rank's address, one gone fails it at once."""
        default = dist.distributed_c10d._get_default_store()
        stores: list[dist.Store] = [dist.PrefixStore(f"{name}{part}", default) for part in ("", "/down", "/end")]
        if gone is not None:
            stores = [Watched(store, timeout, gone, f"rank {self.rank}: ") for store in stores]
        try:
            fresh = _gloo_group(stores[0], self.rank, size, timeout)
            downward = _gloo_group(stores[1], self.rank, size, timeout, fresh)
            # the step-end agreement's: a failed step closes the pipeline group's connections, never these
            agreement = _gloo_group(stores[2], self.rank, size, timeout, fresh)
        except Exception as error:  # noqa: BLE001
            found = next((store.failure for store in stores if isinstance(store, Watched) and store.failure), None)
            dead = gone([rank for rank in range(size) if rank != self.rank]) if gone is not None and not found else []
            if dead:  # (a rank that saw one gone left the rendezvous: a connection to it was reset)
                found = f"rank {self.rank}: {are_gone(dead)}"
            if found:
                raise PipelineError(f"{found} while the pipeline's ranks connected {why}; the pipeline cannot "
                                    "step without them") from error
            raise PipelineError(f"rank {self.rank}: connecting the pipeline's ranks {why} failed (waited "
                                f"{timeout.total_seconds():g} s for every rank): {backend_reason(error)}") from error
        # every rank met in the groups being left: those left before them are used by no rank, and go (their
        # threads and connections with them), so a pipeline failing step after step holds two generations at most
        left = (self._process_group, self._downward, self.agreement_group)
        groups = [g for g in dict.fromkeys(left) if g is not None]
        self.retired, self.abandoned = (groups, self.abandoned), []
        self._process_group, self._downward, self.agreement_group = fresh, downward, agreement

    def close_pairs(self, peers: list[int]) -> None:
        """Close this rank's connections to ``peers`` in the pipeline's group (gloo closes a connection whose
        wait timed out), so a peer waiting for this rank fails at once instead of waiting out its timeout."""
        group = self._process_group
        if group is None or group is dist.group.WORLD:
            return  # never the caller's group
        downward = self._downward  # (set with the group: never None beside one)
        for peer in peers:
            for each in (group, downward) if downward is not group and downward is not None else (group,):
                try:
                    each.recv([torch.zeros(1)], peer, CLOSING_TAG).wait(timedelta(milliseconds=1))
                except Exception:  # noqa: BLE001, S110 (the timeout is the point: it closes the connection)
                    pass

    def group_of(self, sender: int, receiver: int):
        """The gloo group a message from group rank ``sender`` to ``receiver`` travels on (``None`` off gloo):
        once connected, messages to a higher rank and messages to a lower rank each have their own."""
        return self._process_group if sender < receiver else self._downward

    def global_rank(self, peer: int) -> int:
        if self.group is None:
            return peer
        return dist.get_global_rank(self.group, peer)

    def post(self, transfers: list[Transfer], label: object, tag: int | None = None) -> Posted:
        """Post the transfers together (peers are group ranks) under the step's tag (gloo; ``tag``: another);
        ``label`` names them in errors."""
        wire, arrivals = self._stage(transfers) if self.staged else (transfers, ())
        upward, downward, rank = self._process_group, self._downward, self.rank
        try:
            if upward is None or downward is None:
                works = self._post_batch(wire)
            else:  # gloo: each transfer its own send or recv, on the group of its direction (``group_of``)
                tag = self.tag if tag is None else tag
                works = [(upward if rank < t.peer else downward).send([t.tensor], t.peer, tag) if t.send
                         else (upward if t.peer < rank else downward).recv([t.tensor], t.peer, tag) for t in wire]
        except Exception as error:  # noqa: BLE001
            raise PipelineError(f"rank {self.rank}: posting {label} failed: {backend_reason(error)}") from error
        posted = Posted(works, wire, label, self.rank, self.timeout, arrivals)
        self.posted.append(posted)
        return posted

    def _post_batch(self, wire: list[Transfer]) -> list:
        ops = [dist.P2POp(dist.isend if t.send else dist.irecv, t.tensor, self.global_rank(t.peer), self.group)
               for t in wire]
        return list(dist.batch_isend_irecv(ops)) if ops else []

    @staticmethod
    def _stage(transfers: list[Transfer]) -> tuple[list[Transfer], list[tuple[torch.Tensor, torch.Tensor]]]:
        wire, arrivals = [], []
        for t in transfers:
            host = t.tensor.to("cpu") if t.send else torch.empty(t.tensor.shape, dtype=t.tensor.dtype)
            wire.append(Transfer(t.send, host, t.peer))
            if not t.send:
                arrivals.append((host, t.tensor))
        return wire, arrivals

    def exchange(self, transfers: list[Transfer], label: str, tag: int | None = None) -> None:
        """Post and wait at once (headers, gradient sums across chains)."""
        self.post(transfers, label, tag).wait()
