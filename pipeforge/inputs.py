"""Load a schedule from whatever a user names: a .pipe file, a torch CSV, or a library name."""

from __future__ import annotations

import os
from pathlib import Path

from pipeforge.errors import Argument, UsageError, words
from pipeforge.ir import Schedule


def load(
    path: str,
    *,
    defines: dict[str, int] | None = None,
    schedule: str | None = None,
    stages: int | None = None,
    microbatches: int | None = None,
    placement: str | None = None,
) -> Schedule:
    defines = defines or {}
    file = Path(path)
    if file.suffix == ".csv":
        from pipeforge.interop.torch_csv import read_csv

        if defines or schedule:
            raise UsageError(words(Argument("defines"), " and ", Argument("schedule"),
                                   " apply to .pipe files, not to a torch CSV"))
        return read_csv(path, stages=stages, microbatches=microbatches, placement=placement)
    if any(v is not None for v in (stages, microbatches, placement)):
        raise UsageError(words(Argument("stages"), ", ", Argument("microbatches"), " and ", Argument("placement"),
                               " apply to a torch CSV; a .pipe file states them"))
    if file.suffix == ".pipe" or os.path.lexists(file):  # a broken or looping link is a file's error too
        from pipeforge.lang import load_file

        return load_file(path, defines=defines, schedule=schedule)
    from pipeforge.library import load_library_schedule, names

    if path in names():
        if schedule is not None:
            raise UsageError(words(Argument("schedule"),
                                   f" picks one schedule of a .pipe file; {path!r} is a library schedule"))
        return load_library_schedule(path, defines=defines)
    raise UsageError(f"{path!r} is neither a file nor a library schedule (see 'pipeforge library')")
