"""Bytecode of generated modules: compiled in worker processes while the caller goes on, and cached.

``Compiling(sources, jobs, busy)`` starts compiling ``(filename, text)`` pairs in ``jobs`` worker
processes of this same interpreter (``python -I -S``, each handed its share through a temporary file;
by default one per core this process may use but one, kept for the caller's own work, ``busy``: codegen
verifies there, then compiles what the workers were not given). With no worker (``jobs=0``, one core,
small inputs, or where none can start) the sources compile in this process when their codes are asked
for. ``codes()`` returns each source's code as ``marshal`` bytes, in order, or raises ``CompileError``
naming the first source that does not compile; leaving the ``with`` block stops the workers.
``write_cached(source, code)`` writes a written source's ``__pycache__`` file (PEP 552's timestamp
form, as ``py_compile``).
"""

from __future__ import annotations

import importlib.util
import marshal
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import IO

PARALLEL_FROM = 2_000_000  # characters of source below which one in-process compile is quicker than workers

# A worker: marshal'd [(index, filename, text), ...] on stdin; writes the magic number, then per source
# its index, length and marshal'd code; on a source that does not compile, "index\nmessage" on stderr, exit 3.
WORKER = r"""
import marshal, sys
from importlib.util import MAGIC_NUMBER
sources, optimize = marshal.load(sys.stdin.buffer), int(sys.argv[1])
out = sys.stdout.buffer
out.write(MAGIC_NUMBER)
for index, filename, text in sources:
    try:
        code = compile(text, filename, "exec", dont_inherit=True, optimize=optimize)
    except (SyntaxError, ValueError) as error:
        sys.stderr.write(f"{index}\n{error}")
        sys.exit(3)
    data = marshal.dumps(code)
    out.write(index.to_bytes(8, "little") + len(data).to_bytes(8, "little"))
    out.write(data)
"""


class CompileError(Exception):
    """Source ``index`` does not compile (``message`` is Python's)."""

    def __init__(self, index: int, message: str):
        super().__init__(f"source {index} does not compile: {message}")
        self.index = index
        self.message = message


class Compiling:
    """The sources being compiled (a context manager: its end stops the workers that are still running)."""

    def __init__(self, sources: list[tuple[str, str]], jobs: int | None = None, busy: float = 0.0):
        """``busy``: the caller's own work meanwhile, as a fraction of compiling every source here; the
        workers are given that much less, which the caller compiles once done (so both end together)."""
        self.sources = sources
        self.workers: list[tuple[subprocess.Popen, IO[bytes], list[int]]] = []
        jobs = available_cores() - 1 if jobs is None else jobs
        if jobs > 0 and sys.executable and sum(len(text) for _, text in sources) >= PARALLEL_FROM:
            self.start(min(jobs, len(sources)), min(1.0, jobs * (1.0 + busy) / (jobs + 1)))

    def __enter__(self) -> Compiling:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self, jobs: int, given: float) -> None:
        """Workers for the largest sources, ``given`` of all their text (the rest stays here)."""
        shares: list[list[int]] = [[] for _ in range(jobs)]
        sizes = [0] * jobs
        left = given * sum(len(text) for _, text in self.sources)
        for index in sorted(range(len(self.sources)), key=lambda i: -len(self.sources[i][1])):
            if left <= 0:
                break
            least = sizes.index(min(sizes))  # the largest source next to the least loaded worker
            shares[least].append(index)
            sizes[least] += len(self.sources[index][1])
            left -= len(self.sources[index][1])
        shares = [share for share in shares if share]
        for share in shares:
            try:
                self.workers.append(self.started(sorted(share)))
            except OSError:  # no worker can start here: what is left is compiled in-process
                break

    def started(self, share: list[int]) -> tuple[subprocess.Popen, IO[bytes], list[int]]:
        given = tempfile.TemporaryFile()
        taken = tempfile.TemporaryFile()
        try:
            marshal.dump([(i, *self.sources[i]) for i in share], given)
            given.seek(0)
            worker = subprocess.Popen([sys.executable, "-I", "-S", "-c", WORKER, str(sys.flags.optimize)],
                                      stdin=given, stdout=taken, stderr=subprocess.PIPE, close_fds=True)
        except BaseException:
            taken.close()
            raise
        finally:
            given.close()
        return worker, taken, share

    def codes(self) -> list[bytes]:
        """Each source's marshal'd code, in order (workers' shares as they wrote them, the rest here)."""
        found: dict[int, bytes] = {}
        for worker, taken, share in self.workers:
            _, error = worker.communicate()
            if worker.returncode == 3 and error:
                index, _, message = error.decode("utf-8", "replace").partition("\n")
                raise CompileError(int(index), message)
            if worker.returncode == 0:
                found.update(read_codes(taken, share))
        for index, (filename, text) in enumerate(self.sources):
            if index not in found:  # not given to a worker, or its worker failed otherwise: compiled here
                found[index] = marshal.dumps(compile_source(index, filename, text))
        return [found[index] for index in range(len(self.sources))]

    def stop(self) -> None:
        for worker, taken, _ in self.workers:
            if worker.poll() is None:
                worker.kill()
            worker.wait()
            if worker.stderr is not None:
                worker.stderr.close()
            taken.close()
        self.workers = []


def read_codes(taken: IO[bytes], share: list[int]) -> dict[int, bytes]:
    """What a worker wrote: every source of its share (else nothing: they are compiled here instead)."""
    taken.seek(0)
    if taken.read(len(importlib.util.MAGIC_NUMBER)) != importlib.util.MAGIC_NUMBER:
        return {}  # another interpreter behind sys.executable: its bytecode would not load here
    found: dict[int, bytes] = {}
    while header := taken.read(16):
        index, size = int.from_bytes(header[:8], "little"), int.from_bytes(header[8:], "little")
        found[index] = taken.read(size)
    return found if sorted(found) == share else {}


def compile_source(index: int, filename: str, text: str):
    try:
        return compile(text, filename, "exec", dont_inherit=True)
    except (SyntaxError, ValueError) as error:
        raise CompileError(index, str(error)) from error


def available_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return os.cpu_count() or 1


def write_cached(source: Path, code: bytes) -> None:
    """``source``'s ``__pycache__`` file from its marshal'd code, unless Python keeps bytecode elsewhere
    or not at all (the timestamp form of PEP 552: the source's mtime and size, as ``py_compile`` writes)."""
    if sys.dont_write_bytecode or sys.pycache_prefix:
        return
    cached = Path(importlib.util.cache_from_source(str(source)))
    cached.parent.mkdir(exist_ok=True)
    stat = source.stat()
    header = importlib.util.MAGIC_NUMBER + (0).to_bytes(4, "little") + \
        (int(stat.st_mtime) & 0xFFFFFFFF).to_bytes(4, "little") + (stat.st_size & 0xFFFFFFFF).to_bytes(4, "little")
    cached.write_bytes(header + code)
