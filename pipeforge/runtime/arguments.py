"""``make_pipeline``'s plain arguments, checked where they come in.

Each check takes what the caller passed and returns it in the form the runtime uses, or raises a
``PipelineUsageError`` naming the rank (where it is known yet) and the argument, as Python spells it
(``make_pipeline(timeout=...)``). Without them a wrong value reached torch or the standard library
and came back as their own error about their own internals (``timedelta``'s overflow of an infinite
timeout, ``'str' object has no attribute 'size'`` for a group), or passed unnoticed and failed later:
a records path that is a file only when a step failed and its record could not be written.
"""

from __future__ import annotations

import math
import os
from datetime import timedelta
from numbers import Real
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from pipeforge.runtime.p2p import PipelineUsageError
from pipeforge.runtime.records import resolve_directory

MAX_TIMEOUT = 365 * 24 * 3600.0  # seconds: a year (far past any wait; well within what a thread timer and torch take)


def check_group(group: Any, name: str) -> None:
    """``group`` / ``dp_group``: None (``group``: the default group) or a ``ProcessGroup``."""
    if group is None or isinstance(group, dist.ProcessGroup):
        return
    raise PipelineUsageError(f"make_pipeline({name}=...) must be a torch.distributed ProcessGroup (or None), "
                             f"got {_named(group)}")


def checked_timeout(timeout: Any, rank: int) -> float | None:
    """Seconds each wait may take: None (torch's default), a positive number, or a ``timedelta``."""
    if timeout is None:
        return None
    seconds = timeout.total_seconds() if isinstance(timeout, timedelta) else timeout
    if isinstance(seconds, bool) or not isinstance(seconds, Real):
        raise PipelineUsageError(f"rank {rank}: make_pipeline(timeout=...) must be a number of seconds or a "
                                 f"timedelta (or None), got {_named(timeout)}")
    try:
        seconds = float(seconds)
    except OverflowError:  # float(10 ** 400)
        seconds = math.inf
    if not (math.isfinite(seconds) and 0 < seconds <= MAX_TIMEOUT):
        raise PipelineUsageError(f"rank {rank}: make_pipeline(timeout=...) must be a finite number of seconds "
                                 f"> 0 and at most a year ({MAX_TIMEOUT:g}), got {_named(timeout)}")
    return seconds


def checked_device(device: Any, rank: int) -> torch.device:
    """``device``, as ``torch.device`` reads it, and one this process has."""
    try:
        chosen = device if isinstance(device, torch.device) else torch.device(device)
    except (RuntimeError, TypeError, ValueError) as error:
        raise PipelineUsageError(f"rank {rank}: make_pipeline(device={device!r}) is not a device: {error}") from None
    if chosen.type == "meta":
        raise PipelineUsageError(f"rank {rank}: make_pipeline(device={device!r}): a meta tensor holds no values "
                                 "to send or train; materialize the stage modules on a real device")
    if chosen.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if chosen.index is not None and chosen.index >= count or count == 0:
            raise PipelineUsageError(f"rank {rank}: make_pipeline(device={device!r}): this process sees "
                                     f"{count} CUDA device(s)")
    return chosen


def check_callable(function: Any, name: str, rank: int) -> None:
    """``loss_fn``: None or a callable."""
    if function is not None and not callable(function):
        raise PipelineUsageError(f"rank {rank}: make_pipeline({name}=...) must be callable (or None), "
                                 f"got {_named(function)}")


def check_flag(value: Any, name: str, rank: int) -> None:
    """``scale_grads`` / ``fsdp``: True or False (a string such as 'no' would read as True)."""
    if not isinstance(value, bool):
        raise PipelineUsageError(f"rank {rank}: make_pipeline({name}=...) must be True or False, got {_named(value)}")


def checked_records(records: Any, rank: int) -> Path | None:
    """``records`` (or ``PIPEFORGE_RECORDS`` where it is None): a directory, or a path where one can be made."""
    if records is not None and not isinstance(records, (str, os.PathLike)):
        raise PipelineUsageError(f"rank {rank}: make_pipeline(records=...) must be a directory path (or None), "
                                 f"got {_named(records)}")
    directory = resolve_directory(records)
    if directory is None:
        return None
    for folder in (directory, *directory.parents):
        if folder.exists():
            if not folder.is_dir():
                named = "records" if records is not None else "PIPEFORGE_RECORDS"
                raise PipelineUsageError(f"rank {rank}: {named} {str(directory)!r}: {str(folder)!r} is not a "
                                         "directory; a failed step's record could not be written there")
            return directory
    return directory


def _named(value: Any) -> str:
    """The value's type, and its repr where that is short."""
    try:
        text = repr(value)
    except Exception:  # noqa: BLE001 - a repr that fails (an int past Python's 4300 digits) is left out
        return type(value).__name__
    return f"{type(value).__name__} {text[:60]}" if len(text) <= 60 else type(value).__name__
