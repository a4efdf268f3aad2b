"""Pausing Python's cyclic garbage collector around passes that build ~10^5 small acyclic values.

Collections triggered by such allocations cost more than the passes themselves
(a third of simulate's time, more of verify's); the values hold no cycles, so
nothing is lost by collecting after the pass.
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
