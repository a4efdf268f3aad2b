"""Writing output files atomically: a temporary file beside the target, then a rename.

Every file pipeforge writes (.pipe, CSV, pictures, traces, generated modules)
goes through ``write_atomically``, so an error never leaves a half-written file.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from pipeforge.errors import UsageError


def write_atomically(path: str | os.PathLike, data: bytes | str, *, make_dirs: bool = False) -> None:
    """Write ``data`` (text is UTF-8, newlines as given) to ``path``, all or nothing."""
    target = Path(path)
    payload = data.encode("utf-8") if isinstance(data, str) else data
    directory = target.parent if str(target.parent) else Path(".")
    if make_dirs:
        try:
            directory.mkdir(parents=True, exist_ok=True)
        except OSError as error:  # a file where a folder should be, no permission, ...
            raise UsageError(f"cannot create folder {str(directory)!r}: {error.strerror or error}") from None
    if not directory.is_dir():
        raise UsageError(f"cannot write {str(path)!r}: directory {str(directory)!r} does not exist")
    if target.is_dir():
        raise UsageError(f"cannot write {str(path)!r}: it is a directory; name a file")
    try:
        handle, temporary = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=directory)
    except OSError as error:
        raise UsageError(f"cannot write {str(path)!r}: {error.strerror or error}") from None
    try:
        with os.fdopen(handle, "wb") as out:
            out.write(payload)
        os.chmod(temporary, 0o666 & ~_umask())
        os.replace(temporary, target)
    except OSError as error:  # disk full, a read-only target, ...
        Path(temporary).unlink(missing_ok=True)
        raise UsageError(f"cannot write {str(path)!r}: {error.strerror or error}") from None
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
