"""Picklable values between ranks without numpy: ``all_gather_objects`` and ``broadcast_object``.

torch's ``all_gather_object`` and ``broadcast_object_list`` decode what they receive with
``tensor.numpy()``, and torch's wheels do not depend on numpy: where it is absent they raise "Numpy
is not available" on the receiving side. These send the pickled bytes as a uint8 tensor (its length
first) on ``device`` (the transport's: CUDA under NCCL) and decode them through the tensor's storage.
Collectives over ``group``: every rank of it calls them, in the same order.
"""

from __future__ import annotations

import pickle
from typing import Any

import torch
import torch.distributed as dist

CPU = torch.device("cpu")


def all_gather_objects(value: Any, group=None, device: torch.device = CPU) -> list:
    """Every rank's ``value``, in the group's rank order."""
    payload = _encode(value, device)
    size = torch.tensor([payload.numel()], dtype=torch.int64, device=device)
    sizes = [torch.empty_like(size) for _ in range(dist.get_world_size(group))]
    dist.all_gather(sizes, size, group=group)
    lengths = [int(s.item()) for s in sizes]
    padded = torch.zeros(max(lengths), dtype=torch.uint8, device=device)
    padded[:payload.numel()] = payload
    found = [torch.empty_like(padded) for _ in lengths]
    dist.all_gather(found, padded, group=group)
    return [_decode(t[:n]) for t, n in zip(found, lengths)]


def broadcast_object(value: Any, src: int, group=None, device: torch.device = CPU) -> Any:
    """``value`` of the rank ``src`` (a global rank, as torch's ``broadcast`` takes it) on every rank."""
    payload = _encode(value, device) if dist.get_rank() == src else None
    size = torch.tensor([payload.numel() if payload is not None else 0], dtype=torch.int64, device=device)
    dist.broadcast(size, src=src, group=group)
    if payload is None:
        payload = torch.empty(int(size.item()), dtype=torch.uint8, device=device)
    dist.broadcast(payload, src=src, group=group)
    return _decode(payload)


def _encode(value: Any, device: torch.device) -> torch.Tensor:
    return torch.frombuffer(bytearray(pickle.dumps(value)), dtype=torch.uint8).to(device)


def _decode(tensor: torch.Tensor) -> Any:
    exact = tensor.cpu().clone(memory_format=torch.contiguous_format)  # a slice's storage is its base's
    return pickle.loads(bytes(exact.untyped_storage()))
