"""Passes over the IR: pure functions, a schedule in and a new schedule out (one pass a file)."""

from pipeforge.passes.lower import lower, lower_with_origins

__all__ = ["lower", "lower_with_origins"]
