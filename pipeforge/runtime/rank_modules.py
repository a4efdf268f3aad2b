"""The rank modules of a generated module: ``PROGRAMS[rank]`` imports only that rank's file.

``pipeforge codegen`` writes ``NAME.py`` (what a user loads) and, beside it, the
folder ``NAME_ranks_<digest>`` with ``rank_<r>.py`` for every rank. ``NAME.py``'s
``PROGRAMS`` is a ``RankModules``: ``make_pipeline`` asks it for the rank it
runs, and only that file is read, compiled (or taken from ``__pycache__``) and
executed, so a rank's import costs what its own steps cost. A rank module that must be
compiled (no usable ``__pycache__``) and has ``COMPILE_APART_FROM`` lines or more is compiled
in a child process of this interpreter (``RankLoader``): the parser's peak stays out of the rank.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import marshal
import subprocess
import sys
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from types import CodeType
from typing import Any

from pipeforge.runtime.p2p import PipelineError

# Lines of a rank module's source from which it compiles in a child process. CPython's parser holds every
# token of a module and its memo entries until the tree is built: about 3 KB a line of a rank function
# (3.11; 50 MB traced, 54 MB resident, for a ZBV rank at 64 ranks and 1,024 microbatches, 18,584 lines),
# and the allocator keeps most of it after the compile. Below this (about 12 MB) compiling here is quicker.
COMPILE_APART_FROM = 4096
COMPILE_APART_SECONDS = 120.0  # a child still compiling then is given up on: the module compiles here

# The child: the source on stdin, its file name and the optimization level in argv; on stdout the magic
# number of its bytecode, then the marshal'd code.
COMPILER = r"""
import marshal, sys
from importlib.util import MAGIC_NUMBER
code = compile(sys.stdin.buffer.read(), sys.argv[1], "exec", dont_inherit=True, optimize=int(sys.argv[2]))
sys.stdout.buffer.write(MAGIC_NUMBER + marshal.dumps(code))
"""


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
        spec = importlib.util.spec_from_file_location(name, path, loader=RankLoader(name, str(path)))
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


class RankLoader(importlib.machinery.SourceFileLoader):
    """Python's loader of a source file (``__pycache__`` read, and written where Python writes it), but a
    source it must compile of ``COMPILE_APART_FROM`` lines or more is compiled by ``compile_apart``."""

    def source_to_code(self, data: Any, path: Any, *, _optimize: int = -1) -> CodeType:  # type: ignore[override]
        if _optimize == -1 and isinstance(data, bytes) and data.count(b"\n") >= COMPILE_APART_FROM:
            code = compile_apart(data, str(path))
            if code is not None:
                return code
        return super().source_to_code(data, path, _optimize=_optimize)


def compile_apart(source: bytes, filename: str) -> CodeType | None:
    """``compile(source, filename, "exec", dont_inherit=True)``, done in a child process of this interpreter
    (``python -I -S``), so the parser's memory is never this process's. None when no child could do it (none
    can start, it fails or outlasts ``COMPILE_APART_SECONDS``, or another interpreter answers): the caller
    compiles here, and a source that does not compile raises its ``SyntaxError`` there."""
    if not sys.executable:
        return None
    try:
        done = subprocess.run([sys.executable, "-I", "-S", "-c", COMPILER, filename, str(sys.flags.optimize)],
                              input=source, capture_output=True, timeout=COMPILE_APART_SECONDS, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    magic = importlib.util.MAGIC_NUMBER
    if done.returncode != 0 or not done.stdout.startswith(magic):
        return None
    try:
        code = marshal.loads(memoryview(done.stdout)[len(magic):])
    except (EOFError, ValueError, TypeError):
        return None
    return code if isinstance(code, CodeType) else None
