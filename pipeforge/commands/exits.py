"""The exit codes of ``pipeforge`` (a contract other tools rely on), defined once."""

from __future__ import annotations

from enum import IntEnum


class Exit(IntEnum):
    OK = 0  # success; the schedule is valid; the run matched
    INVALID = 1  # the schedule is invalid (verify), or a run did not match
    USAGE = 2  # bad input or usage: the text, a file, an argument
    BUG = 70  # sysexits EX_SOFTWARE: an internal error, neither "invalid" nor "bad input"
    INTERRUPTED = 130  # Ctrl-C (128 + SIGINT)
