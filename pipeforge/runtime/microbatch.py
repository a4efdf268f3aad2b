"""Splitting a batch into microbatches and merging the outputs back (torch's semantics).

Tensors are split on dim 0 with ``torch.tensor_split`` (so a batch that does not
divide evenly gives chunks whose sizes differ by at most one, as torch does);
anything that is not a tensor is passed unchanged to every microbatch.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

def split_args(args: Sequence[Any], chunks: int) -> list[tuple[Any, ...]]:
    """``args`` as ``chunks`` tuples, each holding one microbatch of every tensor argument."""
    columns = [split_value(value, chunks) for value in args]
    return [tuple(column[m] for column in columns) for m in range(chunks)]


def split_value(value: Any, chunks: int) -> list[Any]:
    """One value (a tensor, a tuple of tensors, or anything else) as ``chunks`` microbatches."""
    if isinstance(value, torch.Tensor):
        if value.dim() == 0 or value.size(0) < chunks:
            size = "a scalar" if value.dim() == 0 else f"{value.size(0)} rows"
            raise ValueError(f"cannot split {size} into {chunks} microbatches on dim 0")
        return list(torch.tensor_split(value, chunks, dim=0))
    if isinstance(value, (tuple, list)):
        parts = [split_value(item, chunks) for item in value]
        return [type(value)(part[m] for part in parts) for m in range(chunks)]
    return [value] * chunks


def merge_chunks(chunks: Sequence[Any]) -> Any:
    """Concatenate microbatch outputs on dim 0 (tuples element by element)."""
    if not chunks:
        return None
    first = chunks[0]
    if isinstance(first, torch.Tensor):
        return torch.cat(list(chunks), dim=0)
    if isinstance(first, (tuple, list)):
        return type(first)(merge_chunks([chunk[i] for chunk in chunks]) for i in range(len(first)))
    return list(chunks)


def as_tuple(value: Any) -> tuple[Any, ...]:
    """A stage's output as the argument tuple of the next stage."""
    return tuple(value) if isinstance(value, (tuple, list)) else (value,)
