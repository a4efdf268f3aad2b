"""Splitting a batch into microbatches and merging the outputs back (torch's semantics).

As ``torch.distributed.pipelining.microbatch`` does by default: arguments are
walked through tuples, lists (named tuples too) and dicts; every tensor found
is split on dim 0 with ``torch.tensor_split`` (a batch that does not divide
evenly gives chunks whose sizes differ by at most one); any other value is
given unchanged to every microbatch. A value that holds tensors in another
container (a dataclass, an object's attributes, a set) is refused with an error
naming it, never silently given whole to every microbatch.

Outputs merge the same way: tensors concatenated on dim 0 (zero-dimensional
ones stacked), tuples, lists and dicts field by field, other values kept when
every microbatch gave the same one, else listed.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any, cast

import torch

from pipeforge.runtime.p2p import PipelineUsageError


def split_inputs(args: Sequence[Any], kwargs: Mapping[str, Any], chunks: int,
                 where: str = "step()") -> list[tuple[tuple[Any, ...], dict[str, Any]]]:
    """``(args, kwargs)`` as ``chunks`` microbatches, each an ``(args, kwargs)`` pair."""
    columns = [_split_tensor(value, chunks, where, index) if type(value) is torch.Tensor
               else split_value(value, chunks, f"{where} argument {index}") for index, value in enumerate(args)]
    if not kwargs:
        return [(row, {}) for row in zip(*columns)] if columns else [((), {}) for _ in range(chunks)]
    named = {name: split_value(value, chunks, f"{where} keyword {name!r}") for name, value in kwargs.items()}
    rows = list(zip(*columns)) if columns else [()] * chunks  # microbatch m's positional arguments
    return [(row, {name: parts[m] for name, parts in named.items()}) for m, row in enumerate(rows)]


def split_args(args: Sequence[Any], chunks: int, where: str = "step()") -> list[tuple[Any, ...]]:
    """``args`` as ``chunks`` tuples, each holding one microbatch of every tensor argument."""
    return [chunk for chunk, _ in split_inputs(args, {}, chunks, where)]


def split_value(value: Any, chunks: int, where: str = "the value") -> list[Any]:
    """One value (a tensor, or tuples, lists and dicts of them, or anything else) as ``chunks`` microbatches."""
    if isinstance(value, torch.Tensor):
        return _split_tensor(value, chunks, where)
    if isinstance(value, Mapping):
        fields = {key: split_value(item, chunks, f"{where}[{key!r}]") for key, item in value.items()}
        return [_rebuild_mapping(value, {key: part[m] for key, part in fields.items()}) for m in range(chunks)]
    if isinstance(value, (tuple, list)):
        parts = [split_value(item, chunks, f"{where}[{index}]") for index, item in enumerate(value)]
        return [_rebuild_sequence(value, [part[m] for part in parts]) for m in range(chunks)]
    _refuse_hidden_tensors(value, where)
    return [value] * chunks


def _split_tensor(value: torch.Tensor, chunks: int, where: str, argument: int | None = None) -> list[torch.Tensor]:
    """``value``'s microbatches (``argument``: the index of the positional argument ``where`` names)."""
    if value.dim() > 0 and value.size(0) >= chunks:
        return list(torch.tensor_split(value, chunks, dim=0))
    if argument is not None:
        where = f"{where} argument {argument}"
    if value.dim() == 0:
        raise PipelineUsageError(f"{where}: a 0-dimensional tensor cannot be split into {chunks} microbatches on "
                                 "dim 0; give it a batch dimension, or pass a Python number to give it to every "
                                 "microbatch")
    if value.size(0) < chunks:
        raise PipelineUsageError(f"{where}: {value.size(0)} rows cannot be split into {chunks} microbatches on "
                                 "dim 0; the batch needs at least one row per microbatch")
    return list(torch.tensor_split(value, chunks, dim=0))


def _refuse_hidden_tensors(value: Any, where: str) -> None:
    """A container the split does not walk must not hold tensors (they would reach every microbatch whole)."""
    if isinstance(value, (str, bytes, int, float, bool, type(None))):
        return
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        inner = [getattr(value, f.name) for f in dataclasses.fields(value)]
    elif isinstance(value, (set, frozenset)):
        inner = list(value)
    else:
        inner = list(getattr(value, "__dict__", {}).values())
    if any(isinstance(item, torch.Tensor) for item in inner):
        raise PipelineUsageError(
            f"{where}: a {type(value).__name__} holding tensors cannot be split into microbatches; pass its "
            "tensors directly, or in a tuple, list or dict (those are split on dim 0 field by field)")


def _rebuild_mapping(original: Mapping, items: dict) -> Any:
    # cast: Mapping's own signature takes no items; the concrete class (dict, OrderedDict, a model output) does,
    # or raises the TypeError caught here
    rebuild = cast("Callable[[dict], Any]", type(original))
    try:
        return rebuild(items)
    except TypeError:
        return dict(items)


def _rebuild_sequence(original: tuple | list, items: list) -> Any:
    if isinstance(original, tuple) and hasattr(original, "_fields"):  # a named tuple
        return type(original)(*items)
    return type(original)(items)


def merge_chunks(chunks: Sequence[Any]) -> Any:
    """Microbatch outputs merged: tensors on dim 0, tuples, lists and dicts field by field."""
    if not chunks:
        return None
    first = chunks[0]
    if isinstance(first, torch.Tensor):
        return torch.stack(list(chunks)) if first.dim() == 0 else torch.cat(list(chunks), dim=0)
    if isinstance(first, Mapping):
        return _rebuild_mapping(first, {key: merge_chunks([chunk[key] for chunk in chunks]) for key in first})
    if isinstance(first, (tuple, list)):
        return _rebuild_sequence(first, [merge_chunks([chunk[i] for chunk in chunks]) for i in range(len(first))])
    if all(chunk == first for chunk in chunks[1:]):
        return first
    return list(chunks)


def copied(value: Any) -> Any:
    """``value`` with every tensor in it cloned (tuples, lists and dicts walked): what a check may change."""
    if isinstance(value, torch.Tensor):
        return value.clone()
    if isinstance(value, Mapping):
        return _rebuild_mapping(value, {key: copied(item) for key, item in value.items()})
    if isinstance(value, (tuple, list)):
        return _rebuild_sequence(value, [copied(item) for item in value])
    return value


def as_tuple(value: Any) -> tuple[Any, ...]:
    """A stage's output as the argument tuple of the next stage."""
    return tuple(value) if isinstance(value, (tuple, list)) else (value,)


def to_device(value: Any, device: torch.device) -> Any:
    """``value`` with every tensor in it (in mappings, named tuples, tuples and lists) moved to ``device``."""
    if isinstance(value, torch.Tensor):
        return value if value.device == device else value.to(device)
    if isinstance(value, Mapping):
        return {key: to_device(item, device) for key, item in value.items()}
    if isinstance(value, tuple) and hasattr(value, "_fields"):
        return type(value)(*(to_device(v, device) for v in value))
    if isinstance(value, (tuple, list)):
        return type(value)(to_device(v, device) for v in value)
    return value
