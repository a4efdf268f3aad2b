"""The copy lane of OFFLOAD and RELOAD: how one microbatch's saved tensors move, on a CPU or a GPU.

``copy_lane(device)`` gives one of two lanes with one interface, driven alike (``begin`` around the
copies, ``copy`` per copy, ``finish`` after them, ``wait`` before the backward, ``wait_offload`` before a
step that adds memory where the copy lane rule names an OFFLOAD, docs/semantics.md); ``move`` makes the copies
for both: one copy of the bytes of a storage its saved tensors reach, the tensors rebuilt as the same
views of it, so a RELOAD brings back exactly what its OFFLOAD took.

- ``HostCopies`` (a CPU device): each copy is made at once; nothing to finish or wait for.
- ``StreamCopies`` (CUDA): non-blocking copies on a side stream that first waits for the compute
  stream; sources recorded on the side stream and copies on the compute stream (``record_stream``); an
  event after the copies, which the backward's compute stream waits for, and the host before an addition
  the rule makes wait for an OFFLOAD (its sources' memory is free again). Not run on a GPU yet.
"""

from __future__ import annotations

from contextlib import nullcontext
from typing import Any

import torch

Key = tuple[int, int, int]  # (stage, microbatch, chain)


class HostCopies:
    """The CPU's lane: a copy is made when asked for."""

    def begin(self):
        return nullcontext()

    def copy(self, tensor: torch.Tensor, where: torch.device) -> torch.Tensor:
        return tensor.to(where, copy=True)

    def finish(self, key: Key, sources: list[torch.Tensor], copies: list[torch.Tensor], away: bool = False) -> None:
        pass

    def wait(self, key: Key) -> None:
        pass

    def wait_offload(self, key: Key) -> None:
        pass  # the copy was made when asked for: its source is free already

    def clear(self) -> None:
        pass


class StreamCopies:
    """A CUDA device's lane: non-blocking copies on a side stream, an event per microbatch's transfer.

    ``cuda`` is the ``torch.cuda`` namespace (its ``Stream``, ``Event``, ``stream``, ``current_stream``)."""

    def __init__(self, device: torch.device, cuda: Any = torch.cuda):
        self.device = device
        self.cuda = cuda
        self.stream: Any = None  # made at the first transfer
        self.events: dict[Key, Any] = {}  # the last transfer of each microbatch still to be waited for
        self.offloads: dict[Key, Any] = {}  # each OFFLOAD's event, until an addition waits for it or the step ends

    def begin(self):
        if self.stream is None:
            self.stream = self.cuda.Stream(self.device)
        self.stream.wait_stream(self.cuda.current_stream(self.device))  # what is copied has been written
        return self.cuda.stream(self.stream)

    def copy(self, tensor: torch.Tensor, where: torch.device) -> torch.Tensor:
        return tensor.to(where, non_blocking=True, copy=True)

    def finish(self, key: Key, sources: list[torch.Tensor], copies: list[torch.Tensor], away: bool = False) -> None:
        compute = self.cuda.current_stream(self.device)
        for source in sources:  # read on the side stream: not reused before the copy is done
            self.record(source, self.stream)
        for copy in copies:  # made on the side stream, used (and freed) on the compute stream
            self.record(copy, compute)
        event = self.cuda.Event()
        event.record(self.stream)
        self.events[key] = event
        if away:
            self.offloads[key] = event

    def wait(self, key: Key) -> None:
        event = self.events.pop(key, None)
        if event is not None:
            self.cuda.current_stream(self.device).wait_event(event)

    def wait_offload(self, key: Key) -> None:
        """The host waits for OFFLOAD ``key``'s copies (and so every earlier transfer: one side stream):
        then the allocator may give what they read to the step that adds memory."""
        event = self.offloads.pop(key, None)
        if event is not None:
            event.synchronize()

    def clear(self) -> None:
        self.events.clear()
        self.offloads.clear()

    @staticmethod
    def record(tensor: torch.Tensor, stream: Any) -> None:
        if tensor.is_cuda:  # a host tensor has no allocator stream to record
            tensor.record_stream(stream)


def move(lane: HostCopies | StreamCopies, tensors: list[torch.Tensor],
         where: torch.device) -> tuple[list[torch.Tensor], list[torch.Tensor], list[torch.Tensor]]:
    """``tensors`` (one microbatch's saved tensors) copied to ``where`` on ``lane``, in order: the tensors
    of one storage as one copy of the bytes that covers them, each rebuilt there as the same view of it
    (a view and its transpose stay one tensor: what comes back is what left, byte for byte); with the
    copies' sources and the copies, for ``lane.finish``."""
    groups: dict[int, list[int]] = {}
    alone = []  # tensors that are not plain views of a storage's bytes (sparse, conjugate, quantized, ...)
    for index, tensor in enumerate(tensors):
        if not _plain(tensor):
            alone.append(index)
        elif tensor.numel():
            groups.setdefault(tensor.untyped_storage().data_ptr(), []).append(index)
    moved = [t.new_empty(t.shape, device=where) if _plain(t) and not t.numel() else t for t in tensors]
    sources, copies = [], []
    with torch.no_grad(), lane.begin():
        for index in alone:
            moved[index] = lane.copy(tensors[index], where)
            sources.append(tensors[index])
            copies.append(moved[index])
        for indices in groups.values():
            members = [tensors[i] for i in indices]
            low, high = _covered(members)
            source = _bytes(members[0], low, high)
            copy = lane.copy(source, where)
            sources.append(source)
            copies.append(copy)
            for index, tensor in zip(indices, members):
                moved[index] = _view_of(copy, tensor, low)
    return moved, sources, copies


def _plain(tensor: torch.Tensor) -> bool:
    return (tensor.layout is torch.strided and not tensor.is_conj() and not tensor.is_neg()
            and not tensor.is_quantized and not tensor.is_nested)


def _covered(tensors: list[torch.Tensor]) -> tuple[int, int]:
    """The byte range of their storage that the tensors reach, its start rounded down to 16 bytes."""
    low = min(t.storage_offset() * t.element_size() for t in tensors)
    high = max((t.storage_offset() + sum((n - 1) * s for n, s in zip(t.shape, t.stride())) + 1) * t.element_size()
               for t in tensors)
    return int(low - low % 16), int(high)


def _bytes(tensor: torch.Tensor, low: int, high: int) -> torch.Tensor:
    whole = torch.empty(0, dtype=torch.uint8, device=tensor.device)
    whole.set_(tensor.untyped_storage(), 0, (tensor.untyped_storage().nbytes(),), (1,))
    return whole[low:high]


def _view_of(copy: torch.Tensor, tensor: torch.Tensor, low: int) -> torch.Tensor:
    size = tensor.element_size()
    view = torch.empty(0, dtype=tensor.dtype, device=copy.device)
    view.set_(copy.untyped_storage(), (tensor.storage_offset() * size - low) // size, tensor.shape, tensor.stride())
    return view


def copy_lane(device: torch.device | None) -> HostCopies | StreamCopies:
    """The lane for a rank's device: ``StreamCopies`` on CUDA, ``HostCopies`` elsewhere."""
    if device is not None and device.type == "cuda":
        return StreamCopies(device)
    return HostCopies()


__all__ = ["HostCopies", "StreamCopies", "copy_lane", "move"]
