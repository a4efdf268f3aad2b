"""Counting the microbatch activations a rank holds, the way ``simulate`` counts memory.

A stage keeps a microbatch's activations from its F until its B, or, split,
partly until I and partly until W (``docs/semantics.md``; ``MemorySpec``: F adds
1, I releases ``1 - weights``, W releases ``weights``, B releases 1). The rank
context counts two numbers as its actions run, O(1) each:

- ``awaiting_input``: forwards whose B or I has not run yet;
- ``awaiting_weight``: forwards whose B or W has not run yet;

so the simulator's held memory is ``(1 - weights) * awaiting_input + weights *
awaiting_weight``. Within an overlap step the releases count after the
additions, as the simulator counts them (the actions of an overlap step run
together). ``peak(weights)`` is the largest value seen during the last step
for ``weights`` 0, 0.5 or 1.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

WEIGHTS = (0.0, 0.5, 1.0)


class ActivationCount:
    """Per rank: what the runtime holds between F and I/W/B, and the peaks during one step."""

    __slots__ = ("awaiting_input", "awaiting_weight", "_peaks", "_held_back")

    def __init__(self) -> None:
        self.awaiting_input = 0
        self.awaiting_weight = 0
        self._peaks = [0, 0, 0]  # of 2 * held for weights 0, 0.5, 1 (integers: exact)
        self._held_back: list[int] | None = None  # releases of the overlap step in progress

    def forward(self) -> None:
        self.awaiting_input += 1
        self.awaiting_weight += 1
        a, b = self.awaiting_input, self.awaiting_weight
        peaks = self._peaks
        peaks[0], peaks[1], peaks[2] = max(peaks[0], 2 * a), max(peaks[1], a + b), max(peaks[2], 2 * b)

    def backward(self) -> None:
        self._release(1, 1)

    def backward_input(self) -> None:
        self._release(1, 0)

    def backward_weight(self) -> None:
        self._release(0, 1)

    def _release(self, inputs: int, weights: int) -> None:
        if self._held_back is not None:
            self._held_back[0] += inputs
            self._held_back[1] += weights
            return
        self.awaiting_input -= inputs
        self.awaiting_weight -= weights

    @contextmanager
    def overlap(self) -> Iterator[None]:
        """The actions inside run as one step: additions first, then releases."""
        self._held_back = [0, 0]
        try:
            yield
        finally:
            inputs, weights = self._held_back
            self._held_back = None
            self._release(inputs, weights)

    def peak(self, weights: float) -> float:
        """The most activations held at once during the step, in units of one microbatch on one stage."""
        if weights not in WEIGHTS:
            raise ValueError(f"peaks are kept for weights {WEIGHTS}, not {weights!r}")
        return self._peaks[WEIGHTS.index(weights)] / 2
