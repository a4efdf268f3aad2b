"""Workers for the numpy-free object collectives: each rank first makes ``Tensor.numpy`` fail as it does
where numpy is not installed (torch's wheels do not require it), then gathers, broadcasts and runs
``pipeforge run``'s check of a generated module (its first step's ``check`` gathers and broadcasts)."""

from __future__ import annotations

import torch

from pipeforge.runtime.objects import all_gather_objects, broadcast_object
from pipeforge.tools.reference_check import CheckJob, check_rank


def _no_numpy(self, *args, **kwargs):
    raise RuntimeError("Numpy is not available")


def without_numpy(rank: int, nproc: int, module_path: str) -> dict:
    torch.Tensor.numpy = _no_numpy  # a spawned process of its own: nothing else sees it
    values = [None, "x" * 5000, {"rank": rank, "shape": (2, 3), "dtype": torch.float64}][: rank + 1]
    gathered = all_gather_objects(values)
    broadcast = [broadcast_object(("from", src, "y" * src * 700), src=src) for src in range(nproc)]
    report = check_rank(rank, nproc, CheckJob(module_path, steps=1))
    return {"gathered": gathered, "broadcast": broadcast, "match": report["match"]}
