"""The suite's limits on a loaded machine: ``scaled(seconds)`` is ``seconds`` times ``SCALE``.

``SCALE`` is ``pipeforge.tools.launch.time_scale()`` when the session starts: the
environment variable ``PIPEFORGE_TIME_SCALE``, else the load average per core, at
least 1 (docs/cli.md, Time scale). A limit a healthy run meets in one
second alone may take ten on a machine loaded tenfold; a hang is still caught, in
the same multiple of its limit. ``tests/conftest.py`` scales every pytest-timeout
limit by it too.
"""

from __future__ import annotations

from pipeforge.tools.launch import time_scale

SCALE = time_scale()


def scaled(seconds: float) -> float:
    return seconds * SCALE
