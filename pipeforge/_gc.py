"""Pausing Python's cyclic garbage collector for a command: ``pipeforge.cli.main`` only, never a library call.

A command's passes build ~10^5 small acyclic values, and the collections they trigger cost more
than the passes (a third of simulate's time, more of verify's); nothing is lost by collecting after
the command. A library call leaves the caller's collector alone (tests/test_side_effects.py).
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def gc_paused() -> Iterator[None]:
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
