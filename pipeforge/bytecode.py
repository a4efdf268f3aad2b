"""Bytecode of generated modules: compiled in worker processes while the caller goes on, and cached.

``Compiling(sources, jobs)`` compiles ``(filename, text)`` pairs, given at once or one by one as the
caller makes them (``add(text)``; the names may come later: ``name(filenames)``, or ``codes``), in ``jobs`` worker
processes of this same interpreter (``python -I -S``; by default one per core this process may use but
the caller's own) once the text passes ``PARALLEL_FROM``, and here. No share is fixed beforehand: each
source is claimed once, atomically (a file created exclusively): the workers take them in order as they
come, and ``codes()`` here takes them from the last down, so the caller's own work meanwhile (codegen
renders and verifies) and the compiling end together whatever the load. ``codes()`` returns each
source's code as ``marshal`` bytes, in order, or raises ``CompileError`` naming the first source that
does not compile; leaving the ``with`` block stops the workers. ``write_cached(source, code)`` writes a
written source's ``__pycache__`` file (PEP 552's timestamp form, as ``py_compile``).
"""

from __future__ import annotations

import importlib.util
import marshal
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import IO

PARALLEL_FROM = 2_000_000  # characters of source below which one in-process compile is quicker than workers

# A worker, in the folder argv[1]: on stdin a line per source, its index (its text marshal'd in
# source_<index>), "names" once the file names are in names (marshal'd), and "end"; it compiles each
# source it claims (claim_<index>, created exclusively), in order, under a name it replaces by the real one
# once known, writing the magic number, then per source its index, length and marshal'd code. It claims
# nothing after a source that does not compile (the caller compiles that one again and reports it).
WORKER = r"""
import marshal, os, sys
from importlib.util import MAGIC_NUMBER
from types import CodeType
folder, optimize = sys.argv[1], int(sys.argv[2])
out = sys.stdout.buffer
out.write(MAGIC_NUMBER)
def claimed(index):
    try:
        os.close(os.open(os.path.join(folder, f"claim_{index}"), os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return False
    return True
def named(code, filename):
    consts = tuple(named(c, filename) if isinstance(c, CodeType) else c for c in code.co_consts)
    return code.replace(co_filename=filename, co_consts=consts)
def put(index, code):
    data = marshal.dumps(named(code, names[index]))
    out.write(index.to_bytes(8, "little") + len(data).to_bytes(8, "little"))
    out.write(data)
def named_all():
    global names
    with open(os.path.join(folder, "names"), "rb") as given:
        names = marshal.load(given)
    for index, code in codes.items():
        put(index, code)
    codes.clear()
codes, names, failed = {}, None, False
for line in sys.stdin.buffer:
    if line == b"end\n":
        break
    if line == b"names\n":
        named_all()
        continue
    index = int(line)
    if failed or not claimed(index):
        continue
    with open(os.path.join(folder, f"source_{index}"), "rb") as given:
        text = marshal.load(given)
    try:
        code = compile(text, "<pending>", "exec", dont_inherit=True, optimize=optimize)
    except (SyntaxError, ValueError):
        failed = True
        continue
    if names is None:
        codes[index] = code
    else:
        put(index, code)
else:
    sys.exit(4)  # no "end": the caller has gone
if names is None:
    named_all()
"""


class CompileError(Exception):
    """Source ``index`` does not compile (``message`` is Python's)."""

    def __init__(self, index: int, message: str):
        super().__init__(f"source {index} does not compile: {message}")
        self.index = index
        self.message = message


class Compiling:
    """The sources being compiled (a context manager: its end stops the workers that are still running)."""

    def __init__(self, sources: Sequence[tuple[str, str]] = (), jobs: int | None = None):
        self.texts: list[str] = []
        self.names: list[str | None] = []
        self.jobs = available_cores() - 1 if jobs is None else jobs
        self.size = 0
        self.named = False  # the workers have the file names
        self.folder: str | None = None  # the workers' folder (sources, claims, names), once started
        self.workers: list[tuple[subprocess.Popen, IO[bytes]]] = []
        for filename, text in sources:
            self.add(text, filename, start=False)
        self.start_if_large(len(self.texts) or self.jobs)

    def __enter__(self) -> Compiling:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def add(self, text: str, filename: str | None = None, *, start: bool = True) -> None:
        """One more source (its name may wait for ``codes``): handed to the workers, which start once
        the sources given pass ``PARALLEL_FROM`` characters."""
        index = len(self.texts)
        self.texts.append(text)
        self.names.append(filename)
        self.size += len(text)
        if self.folder is not None:
            self.give(index)
        elif start:
            self.start_if_large(self.jobs)

    def start_if_large(self, jobs: int) -> None:
        if self.folder is not None or self.jobs <= 0 or not sys.executable or self.size < PARALLEL_FROM:
            return
        self.folder = tempfile.mkdtemp(prefix="pipeforge-compiling-")
        for _ in range(min(self.jobs, jobs)):
            try:
                self.workers.append(self.started())
            except OSError:  # no worker can start here: the sources are compiled in-process
                break
        for index in range(len(self.texts)):
            self.give(index)

    def started(self) -> tuple[subprocess.Popen, IO[bytes]]:
        taken = tempfile.TemporaryFile()
        try:
            worker = subprocess.Popen([sys.executable, "-I", "-S", "-c", WORKER, str(self.folder),
                                       str(sys.flags.optimize)], stdin=subprocess.PIPE, stdout=taken,
                                      stderr=subprocess.DEVNULL, close_fds=True)
        except BaseException:
            taken.close()
            raise
        return worker, taken

    def give(self, index: int) -> None:
        """Source ``index`` to every worker: its text in the folder, then its index on their stdin."""
        if not self.workers:
            return
        with open(os.path.join(str(self.folder), f"source_{index}"), "wb") as written:
            marshal.dump(self.texts[index], written)
        self.tell(b"%d\n" % index)

    def tell(self, line: bytes) -> None:
        for worker, _ in self.workers:
            try:
                assert worker.stdin is not None
                worker.stdin.write(line)
                worker.stdin.flush()
            except OSError:  # a worker that has gone: what it claimed is compiled here
                pass

    def claim(self, index: int) -> bool:
        try:
            os.close(os.open(os.path.join(str(self.folder), f"claim_{index}"), os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            return False
        return True

    def name(self, filenames: Sequence[str | None]) -> None:
        """The file names of every source given so far (the workers name their codes from now on, not
        after the caller's work)."""
        if len(filenames) != len(self.texts) or not all(isinstance(name, str) for name in filenames):
            raise ValueError(f"{len(self.texts)} sources need as many file names, got {list(filenames)!r}")
        self.names = list(filenames)
        if self.workers and not self.named:
            with open(os.path.join(str(self.folder), "names"), "wb") as written:
                marshal.dump(self.names, written)
            self.tell(b"names\n")
        self.named = True

    def codes(self, filenames: Sequence[str | None] | None = None) -> list[bytes]:
        """Each source's marshal'd code, in order: this process takes the sources no worker has claimed
        yet from the last down, then the workers' codes are read, and any source still without code
        (a worker that failed, a source that does not compile) is compiled here, in order."""
        if filenames is not None or not self.named:
            self.name(self.names if filenames is None else filenames)
        names = [str(name) for name in self.names]
        if len(names) != len(self.texts):
            raise ValueError(f"{len(self.texts)} sources need as many file names, got {len(names)}")
        found: dict[int, bytes] = {}
        if self.workers:
            self.tell(b"end\n")
            for worker, _ in self.workers:
                _close_input(worker)
        for index in reversed(range(len(self.texts))):
            if self.workers and not self.claim(index):
                break  # a worker has it, and every source before it
            try:
                found[index] = marshal.dumps(compile_source(index, names[index], self.texts[index]))
            except CompileError:
                break  # compiled again below, after every source before it
        for worker, taken in self.workers:
            if worker.wait() == 0:
                for index, code in read_codes(taken).items():
                    found.setdefault(index, code)
        for index, (filename, text) in enumerate(zip(names, self.texts, strict=True)):
            if index not in found:  # a worker's that failed, or the first that does not compile: here
                found[index] = marshal.dumps(compile_source(index, filename, text))
        return [found[index] for index in range(len(self.texts))]

    def stop(self) -> None:
        for worker, taken in self.workers:
            if worker.poll() is None:
                worker.kill()
            worker.wait()
            _close_input(worker)
            taken.close()
        self.workers = []
        if self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)
            self.folder = None


def _close_input(worker: subprocess.Popen) -> None:
    """Close a worker's stdin (its end of the sources), a worker gone already or not."""
    if worker.stdin is not None:
        try:
            worker.stdin.close()
        except OSError:
            pass


def read_codes(taken: IO[bytes]) -> dict[int, bytes]:
    """What a worker wrote, each source complete (else nothing: another interpreter's bytecode)."""
    taken.seek(0)
    if taken.read(len(importlib.util.MAGIC_NUMBER)) != importlib.util.MAGIC_NUMBER:
        return {}  # another interpreter behind sys.executable: its bytecode would not load here
    found: dict[int, bytes] = {}
    while len(header := taken.read(16)) == 16:
        index, size = int.from_bytes(header[:8], "little"), int.from_bytes(header[8:], "little")
        data = taken.read(size)
        if len(data) == size:
            found[index] = data
    return found


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
    or not at all (the timestamp form of PEP 552: the source's mtime and size, as ``py_compile``)."""
    if sys.dont_write_bytecode or sys.pycache_prefix:
        return
    cached = Path(importlib.util.cache_from_source(str(source)))
    cached.parent.mkdir(exist_ok=True)
    stat = source.stat()
    header = importlib.util.MAGIC_NUMBER + (0).to_bytes(4, "little") + \
        (int(stat.st_mtime) & 0xFFFFFFFF).to_bytes(4, "little") + (stat.st_size & 0xFFFFFFFF).to_bytes(4, "little")
    cached.write_bytes(header + code)
