"""Reading input files within bounds; writing output files atomically.

Every file pipeforge reads (.pipe, CSV, cost files, a module at an output path)
goes through ``read_bounded``: it must be a regular file (a FIFO, device or
folder is refused before it is opened, so nothing blocks or streams forever)
no larger than the limit for its kind (``LIMITS``, named in the message).
Every file pipeforge writes (.pipe, CSV, pictures, traces, generated modules)
goes through ``write_atomically``, so an error never leaves a half-written file;
every command's output through ``write_output``, whose replacement rule
(``check_replaceable``, decided under the folder's lock) keeps two writers of one
output from both succeeding silently: a file is replaced only by its own bytes,
by the same thing (``ours``, as ``held`` reads it), or when forced.
"""

from __future__ import annotations

import ast
import errno
import os
import re
import stat
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

from pipeforge.errors import Argument, Part, UsageError, words

MiB = 1 << 20

# The most bytes read of each kind of input. A .pipe or CSV of 2,000,000 actions (the language's
# bound, pipeforge.lang.context.MAX_ACTIONS) in its explicit form fits in 32 MiB.
LIMITS = {
    "schedule file": 32 * MiB,  # a .pipe file or a torch CSV
    "cost file": 4 * MiB,  # simulate/optimize --costs
    "record": 4 * MiB,  # a rank's failure record (pipeforge diagnose)
    "output file": 4 * MiB,  # how much of a file at an output path is read to judge what it holds
    "generated module": 64 * MiB,  # a module codegen wrote, read back by pipeforge diagnose (400,000 actions fit)
}

_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def read_bounded(path: str | os.PathLike, kind: str, *, head: int | None = None) -> bytes:
    """The bytes of the regular file at ``path``, a ``UsageError`` naming it otherwise.

    ``kind`` is a key of ``LIMITS``: a larger file is refused, naming the limit.
    ``head``: read at most that many bytes from the start instead, whatever the size.
    """
    name = str(path)
    limit = LIMITS[kind]
    info = _stat(name, lambda: os.stat(name))
    _require_regular(name, info, kind)
    if head is None and info.st_size > limit:
        raise _too_large(name, info.st_size, kind)
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(name, flags)
    except OSError as error:
        raise _cannot_read(name, error) from None
    try:
        info = _stat(name, lambda: os.fstat(fd))  # what was opened: a FIFO put there since the check is refused too
        _require_regular(name, info, kind)
        wanted = head if head is not None else limit + 1
        data = _read_up_to(name, fd, wanted)
    finally:
        os.close(fd)
    if head is None and len(data) > limit:  # it grew since the check
        raise _too_large(name, len(data), kind)
    return data


BOM = b"\xef\xbb\xbf"  # UTF-8's byte-order mark, which editors on Windows write at the start of a text file


def without_bom(data: bytes) -> bytes:
    """``data`` without a leading UTF-8 byte-order mark: a text file's first line and column count from the
    character after it, as its editor shows it (the mark is invisible there)."""
    return data[len(BOM):] if data.startswith(BOM) else data


MAX_JSON_DIGITS = 40  # an integer in a JSON input (a count, a byte size) never needs more


class JsonError(UsageError):
    """A JSON input that is not JSON within bounds: ``where`` (``line L column C``) and ``problem``."""

    def __init__(self, name: str, where: str, problem: str):
        super().__init__(f"{name}: {where}: {problem}")
        self.name, self.where, self.problem = name, where, problem


class _LongNumber(Exception):
    pass


def read_json(path: str | os.PathLike, kind: str) -> object:
    """The JSON value of the file at ``path`` (``read_bounded``), parsed within bounds: a ``JsonError``
    for text that is not UTF-8 or not JSON, nests deeper than the parser's stack, or holds an integer of
    more than ``MAX_JSON_DIGITS`` digits."""
    import json

    name = str(path)
    data = without_bom(read_bounded(path, kind))
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise JsonError(name, f"byte {error.start}", "not UTF-8 text") from None
    try:
        return json.loads(text, parse_int=_bounded_int)
    except json.JSONDecodeError as error:
        raise JsonError(name, f"line {error.lineno} column {error.colno}", f"not JSON: {error.msg}") from None
    except RecursionError:
        raise JsonError(name, "$", "its arrays or objects nest too deeply") from None
    except _LongNumber as long:
        where = _position(text, text.find(str(long)))
        raise JsonError(name, where, f"an integer of {len(str(long))} digits; at most {MAX_JSON_DIGITS}") from None


def _bounded_int(digits: str) -> int:
    if len(digits.lstrip("-")) > MAX_JSON_DIGITS:
        raise _LongNumber(digits)
    return int(digits)


def _position(text: str, offset: int) -> str:
    line = text.count("\n", 0, max(offset, 0)) + 1
    return f"line {line} column {offset - (text.rfind(chr(10), 0, max(offset, 0)) + 1) + 1}"


def require_regular_file(path: str | os.PathLike, kind: str) -> None:
    """Refuse (UsageError naming it) a path that is missing, unreadable or not a regular file: for a file
    another program opens (``profile``'s MODEL.py, which Python imports), so that it cannot block."""
    name = str(path)
    _require_regular(name, _stat(name, lambda: os.stat(name)), kind)


def module_head(path: str | os.PathLike) -> ast.Module | None:
    """The top-level statements of a Python file before its first function or class, or None.

    For judging what a file at an output path holds (``generator.generated_schedule``)
    without parsing it whole: at most ``LIMITS["output file"]`` bytes are read, and a
    head that is not Python, nests too deeply for the parser, or cannot be read
    (a FIFO, a device, no permission) gives None.
    """
    data = output_head(Path(path))
    return None if data is None else parse_module_head(data)


def output_head(path: Path) -> bytes | None:
    """The first ``LIMITS["output file"]`` bytes of the regular file at ``path``; None where it cannot be read."""
    try:
        return read_bounded(path, "output file", head=LIMITS["output file"])
    except UsageError:
        return None


def parse_module_head(data: bytes) -> ast.Module | None:
    """``module_head`` of the bytes ``data``."""
    cut = re.search(rb"^(def|class|async|@)", data, re.MULTILINE)
    try:
        return ast.parse(data[:cut.start()] if cut else data)
    except (SyntaxError, ValueError, MemoryError, RecursionError):  # the parser's own stack overflows
        return None


def _stat(name: str, call) -> os.stat_result:
    try:
        return call()
    except OSError as error:
        raise _cannot_read(name, error) from None


def _too_large(name: str, size: int, kind: str) -> UsageError:
    return UsageError(f"{name!r} holds {size} bytes; a {kind} may hold at most {_size_text(LIMITS[kind])}")


def _require_regular(name: str, info: os.stat_result, kind: str) -> None:
    if stat.S_ISREG(info.st_mode):
        return
    what = next((text for test, text in _KINDS if test(info.st_mode)), "not a regular file")
    raise UsageError(f"{name!r} is {what}, not a regular file; expected a {kind}")


def _read_up_to(name: str, fd: int, count: int) -> bytes:
    chunks: list[bytes] = []
    left = count
    while left > 0:
        try:
            chunk = os.read(fd, min(left, 4 * MiB))
        except OSError as error:
            raise _cannot_read(name, error) from None
        if not chunk:
            break
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def _cannot_read(name: str, error: OSError) -> UsageError:
    if isinstance(error, FileNotFoundError):
        return UsageError(f"cannot read {name!r}: no such file")
    return UsageError(f"cannot read {name!r}: {error.strerror or error}")


def _size_text(size: int) -> str:
    return f"{size // MiB} MiB" if size % MiB == 0 else f"{size} bytes"


def write_atomically(path: str | os.PathLike, data: bytes | str, *, make_dirs: bool = False,
                     replaceable: Callable[[Path], None] | None = None) -> None:
    """Write ``data`` (text is UTF-8, newlines as given) to ``path``, all or nothing.

    ``replaceable(path)`` raises when what is at ``path`` must not be replaced; it runs
    under a lock on the folder that every pipeforge writer there takes, so of two
    writers of one output the second sees the first's file (never both succeed
    silently). A FIFO, device or socket at ``path`` is refused, never replaced.
    """
    with locked_output(path, make_dirs=make_dirs, replaceable=replaceable) as write:
        write(data)


@contextmanager
def locked_output(path: str | os.PathLike, *, make_dirs: bool = False,
                  replaceable: Callable[[Path], None] | None = None) -> Iterator[Callable[[bytes | str], None]]:
    """For an output of several files (codegen's module and its rank modules): the folder of ``path``
    locked as ``write_atomically`` locks it, ``path`` checked as it checks it; yields the function that
    writes ``path`` atomically, to call once the files it names are in place."""
    target = Path(path)
    directory = target.parent if str(target.parent) else Path(".")
    with _made_folders() as made:
        made.extend(_require_folder(directory, str(path), make_dirs))
        with _folder_lock(directory, str(path)):
            refuse_special(target, str(path))
            if replaceable is not None:
                replaceable(target)

            def write(data: bytes | str) -> None:
                _replace(target, data.encode("utf-8") if isinstance(data, str) else data, directory, str(path))

            yield write


def write_output(path: str | os.PathLike, data: bytes | str, *, force: bool = False,
                 held: Callable[[bytes], str | None] | None = None, make_dirs: bool = False) -> None:
    """Write a command's output ``data`` to ``path`` atomically (``write_atomically``), replacing a file
    there only as ``check_replaceable`` allows (``held``: what a file holds, in words; ``data`` is what
    ``held`` reads in it), decided under the folder's lock; anything may be replaced when ``force``."""
    write_outputs([(path, data)], force=force, held=held, make_dirs=make_dirs)


def write_outputs(outputs: list[tuple[str | os.PathLike, bytes | str]], *, force: bool = False,
                  held: Callable[[bytes], str | None] | None = None, make_dirs: bool = False) -> None:
    """``write_output`` for the files of one output together (``export``'s CSV and settings): every
    folder's lock taken (in one order), every file checked, then each written; one refused, none is."""
    payloads = [(Path(path), data.encode("utf-8") if isinstance(data, str) else data) for path, data in outputs]
    seen: dict[str, Path] = {}
    for target, _ in payloads:
        other = seen.setdefault(os.path.realpath(target), target)
        if other is not target:
            raise UsageError(f"{str(other)!r} and {str(target)!r} name one file: each output needs its own")
    with _made_folders() as made:
        folders: dict[str, tuple[Path, str]] = {}
        for target, _ in payloads:
            folder = target.parent if str(target.parent) else Path(".")
            made.extend(_require_folder(folder, str(target), make_dirs))
            folders.setdefault(os.path.realpath(folder), (folder, str(target)))
        _write_locked(payloads, folders, force, held)


def _write_locked(payloads: list[tuple[Path, bytes]], folders: dict[str, tuple[Path, str]], force: bool,
                  held: Callable[[bytes], str | None] | None) -> None:
    with ExitStack() as locks:
        for key in sorted(folders):
            locks.enter_context(_folder_lock(*folders[key]))
        for target, payload in payloads:
            refuse_special(target, str(target))
            if not force:
                check_replaceable(target, payload=payload, held=held, ours=None if held is None else held(payload))
        staged: list[tuple[str, Path, str]] = []
        try:  # every file staged first: one that cannot be written leaves every target as it was
            for target, payload in payloads:
                folder = target.parent if str(target.parent) else Path(".")
                staged.append((_stage(target, payload, folder, str(target)), target, str(target)))
        except BaseException:
            for temporary, _, _ in staged:
                Path(temporary).unlink(missing_ok=True)
            raise
        _commit(staged)


def check_replaceable(target: Path, *, payload: bytes | None = None, ours: str | None = None,
                      held: Callable[[bytes], str | None] | None = None, foreign: str = "holds something else",
                      elsewhere: tuple[Part, ...] = ("name another file",)) -> None:
    """The replacement rule, decided here only: a file at ``target`` may be replaced when it holds
    ``payload`` byte for byte, or when ``held`` (what the first ``LIMITS["output file"]`` bytes of a
    file hold, in words such as ``schedule 'x'``; None when it cannot tell) reads ``ours`` in it.
    Otherwise a ``UsageError`` says what is there (``foreign`` where ``held`` cannot tell) and what
    this is, and asks for ``force`` or ``elsewhere``. A folder, FIFO or device is refused, forced or not;
    an absent ``target`` is always written."""
    name = str(target)
    if not os.path.lexists(target):
        return
    refuse_special(target, name)
    if payload is not None and _holds(target, payload):
        return
    head = output_head(target) if held is not None else None
    found = held(head) if head is not None and held is not None else None
    if found is not None and found == ours:
        return
    if not target.exists():
        told = f"{name!r} is a symbolic link to {os.readlink(target)!r}, which does not exist"
    elif ours is None:
        told = f"{name!r} exists and holds something other than what this writes"
    else:
        what = f"holds {found}" if found is not None else foreign
        told = f"{name!r} exists and {what}; this is {ours}"
    raise UsageError(words(told, ". Pass ", Argument("force"), " to replace it, or ", *elsewhere))


def _holds(target: Path, payload: bytes) -> bool:
    """Whether the regular file at ``target`` holds exactly ``payload`` (read no further than its length)."""
    try:
        if target.stat().st_size != len(payload):
            return False
        return read_bounded(target, "output file", head=len(payload) + 1) == payload
    except (OSError, UsageError):
        return False


@contextmanager
def _made_folders() -> Iterator[list[Path]]:
    """The folders an output made for itself (``_require_folder``'s list), removed again, innermost first,
    when the output fails: a refused or failed write leaves no folder it made (one another process has
    put something in meanwhile stays)."""
    made: list[Path] = []
    try:
        yield made
    except BaseException:
        _remove_made(made)
        raise


def _remove_made(made: list[Path]) -> None:
    for folder in reversed(made):
        try:
            folder.rmdir()
        except OSError:  # not empty (or gone): it and its parents stay
            return


def _require_folder(directory: Path, name: str, make: bool) -> list[Path]:
    """``directory`` is a folder (made, with its parents, when ``make``); a UsageError saying why not.
    Returns the folders it made, outermost first."""
    made = [folder for folder in (directory, *directory.parents) if not os.path.lexists(folder)][::-1] \
        if make else []
    if make and not directory.exists():
        try:
            directory.mkdir(parents=True, exist_ok=True)
        except OSError as error:  # a file where a parent folder should be, no permission, ...
            _remove_made(made)  # the parents it made before the one it could not
            raise UsageError(f"cannot create folder {str(directory)!r}: {error.strerror or error}") from None
    if directory.is_dir():
        return made
    if os.path.lexists(directory):
        raise UsageError(f"cannot write {name!r}: {str(directory)!r} is not a folder")
    raise UsageError(f"cannot write {name!r}: directory {str(directory)!r} does not exist")


def refuse_special(target: Path, name: str) -> None:
    """Refuse (UsageError) to write ``target`` when it is a folder, FIFO, device or socket (links followed)."""
    try:
        info = target.stat()
    except OSError as error:  # absent, a dangling link, ...: the rename decides; a loop of links never will
        if error.errno == errno.ELOOP:
            raise UsageError(f"cannot write {name!r}: {error.strerror}; name a file") from None
        return
    if stat.S_ISDIR(info.st_mode):
        raise UsageError(f"cannot write {name!r}: it is a directory; name a file")
    if not stat.S_ISREG(info.st_mode):
        what = next((text for test, text in _KINDS if test(info.st_mode)), "not a regular file")
        raise UsageError(f"cannot write {name!r}: it is {what}; pipeforge writes regular files only")


def _replace(target: Path, payload: bytes, directory: Path, name: str) -> None:
    _commit([(_stage(target, payload, directory, name), target, name)])


def _stage(target: Path, payload: bytes, directory: Path, name: str) -> str:
    """``payload`` in a new temporary file beside ``target``: its path (removed again on any error)."""
    try:
        handle, temporary = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=directory)
    except OSError as error:
        raise UsageError(f"cannot write {name!r}: {error.strerror or error}") from None
    try:
        with os.fdopen(handle, "wb") as out:
            out.write(payload)
        os.chmod(temporary, 0o666 & ~umask())
    except OSError as error:  # disk full, ...
        Path(temporary).unlink(missing_ok=True)
        raise UsageError(f"cannot write {name!r}: {error.strerror or error}") from None
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    return temporary


def _commit(staged: list[tuple[str, Path, str]]) -> None:
    """Each staged temporary file renamed over its target; on an error the ones not yet renamed are removed."""
    try:
        for temporary, target, name in staged:
            try:
                os.replace(temporary, target)
            except OSError as error:  # a read-only target, ...
                raise UsageError(f"cannot write {name!r}: {error.strerror or error}") from None
    finally:
        for temporary, _, _ in staged:
            Path(temporary).unlink(missing_ok=True)


LOCK_WAIT = 60.0  # seconds a writer waits for another pipeforge writing into the same folder


@contextmanager
def _folder_lock(directory: Path, name: str) -> Iterator[None]:
    """An exclusive ``flock`` on ``directory`` itself (no lock file left behind) while held."""
    try:
        import fcntl
    except ImportError:  # not POSIX: no lock
        yield
        return
    try:
        fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError as error:
        raise UsageError(f"cannot write {name!r}: {error.strerror or error}") from None
    try:
        deadline = time.monotonic() + LOCK_WAIT
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise UsageError(f"cannot write {name!r}: another process has held the lock on "
                                     f"{str(directory)!r} for {LOCK_WAIT:.0f} s") from None
                time.sleep(0.01)
            except OSError:  # a file system without flock: no lock
                break
        yield
    finally:
        os.close(fd)  # releases the lock


def umask() -> int:
    """The process's file mode creation mask (read by setting it and setting it back)."""
    mask = os.umask(0)
    os.umask(mask)
    return mask
