"""A model's values from a checkpoint, read only for the parameters a rank owns.

``values(source)`` turns what ``split(..., state_dict=...)`` takes into a
mapping from the model's parameter names to tensors: a mapping as it is; a
``.safetensors`` file, a list of them, or a directory holding them (Hugging
Face's sharded ``model-00001-of-00004.safetensors`` and its index) opened
lazily, so that only the tensors asked for are read from disk.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path

import torch

from pipeforge.errors import UsageError


def values(source) -> Mapping[str, torch.Tensor]:
    if isinstance(source, Mapping):
        return source
    paths = [Path(p) for p in source] if isinstance(source, (list, tuple)) else [Path(source)]
    files = [f for p in paths for f in (sorted(p.glob("*.safetensors")) if p.is_dir() else [p])]
    if not files or any(not f.is_file() or f.suffix != ".safetensors" for f in files):
        raise UsageError(f"pipeforge.split: state_dict={source!r} names no .safetensors file (give a mapping, a "
                         ".safetensors file, a list of them, or a directory holding them)")
    return SafetensorsShards(files)


class SafetensorsShards(Mapping):
    """The tensors of some safetensors files by name, each read when asked for."""

    def __init__(self, files: list[Path]):
        from safetensors import safe_open

        self._handles = [safe_open(str(f), framework="pt", device="cpu") for f in files]
        self._where = {key: handle for handle in self._handles for key in handle.keys()}  # noqa: SIM118 (not a dict)

    def __getitem__(self, key: str) -> torch.Tensor:
        return self._where[key].get_tensor(key)

    def __iter__(self) -> Iterator[str]:
        return iter(self._where)

    def __len__(self) -> int:
        return len(self._where)
