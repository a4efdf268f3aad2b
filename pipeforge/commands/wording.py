"""Library errors worded for the command line: each argument named as the flag that sets it.

The library names arguments as Python does (``defines['Q']``, ``stages=3``,
``costs item 'F=x'``); a user of ``pipeforge`` typed flags, so the commands
print the same error with flags (``-D Q``, ``--stages 3``, ``--cost item 'F=x'``).
"""

from __future__ import annotations

from pipeforge.errors import Argument, PipeforgeError

FLAGS = {
    "defines": "-D",
    "schedule": "--schedule",
    "stages": "--stages",
    "microbatches": "--microbatches",
    "placement": "--placement",
    "costs": "--cost",
    "memory_limit": "--memory-limit",
    "strategy": "--strategy",
    "output": "-o",
    "name": "--name",
    "force": "--force",
}


def flag(argument: Argument) -> str:
    """The flag (and its item or value) that sets ``argument``: ``-D Q``, ``--stages 3``, ``--cost``."""
    name = FLAGS.get(argument.keyword) or "--" + argument.keyword.replace("_", "-")
    if argument.item is not None:
        return f"{name} {argument.item}" if argument.keyword == "defines" else f"{name} item {argument.item!r}"
    return name if argument.value is None else f"{name} {argument.value}"


def render(error: PipeforgeError) -> str:
    """The full report of ``error`` as the command line prints it."""
    return error.render(flag)


def message(error: PipeforgeError) -> str:
    """The message of ``error`` alone, as the command line words it (for ``--json``)."""
    return error.worded(flag)
