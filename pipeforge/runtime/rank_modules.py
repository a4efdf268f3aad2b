"""The rank modules of a generated module: ``PROGRAMS[rank]`` imports only that rank's file.

``pipeforge codegen`` writes ``NAME.py`` (what a user loads) and, beside it, the
folder ``NAME_ranks_<digest>`` with ``rank_<r>.py`` for every rank. ``NAME.py``'s
``PROGRAMS`` is a ``RankModules``: ``make_pipeline`` asks it for the rank it
runs, and only that file is read, compiled (or taken from ``__pycache__``) and
executed, so a rank's import costs what its own steps cost.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from pipeforge.runtime.p2p import PipelineError


class RankModules(Mapping[int, Callable[[Any], None]]):
    """rank -> the function ``rank_<rank>`` of ``<folder>/rank_<rank>.py`` beside ``main_file``, imported
    on first use and kept."""

    def __init__(self, main_file: str, folder: str, ranks: int):
        self.folder = Path(main_file).resolve().parent / folder
        self.ranks = ranks
        self._loaded: dict[int, Callable[[Any], None]] = {}

    def __getitem__(self, rank: int) -> Callable[[Any], None]:
        program = self._loaded.get(rank)
        if program is None:
            if not isinstance(rank, int) or not 0 <= rank < self.ranks:
                raise KeyError(rank)
            program = self._loaded[rank] = self._load(rank)
        return program

    def __iter__(self) -> Iterator[int]:
        return iter(range(self.ranks))

    def __len__(self) -> int:
        return self.ranks

    def _load(self, rank: int) -> Callable[[Any], None]:
        path = self.folder / f"rank_{rank}.py"
        if not path.is_file():
            raise PipelineError(f"rank {rank}: the generated module's rank file {str(path)!r} is missing; "
                                "regenerate the module with pipeforge codegen")
        name = f"pipeforge_rank_{abs(hash(str(path)))}"
        spec = importlib.util.spec_from_file_location(name, path)
        assert spec is not None and spec.loader is not None, "a .py file has its spec and loader"
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # tracebacks and pickling find it
        try:
            spec.loader.exec_module(module)
        except BaseException:
            sys.modules.pop(name, None)
            raise
        function: Callable[[Any], None] = getattr(module, f"rank_{rank}")  # (generated: rank_<r>(ctx))
        return function
