"""Counting the microbatch activations a rank holds, the way ``simulate`` counts memory.

A stage keeps a microbatch's activations from its F until its B, or, split,
partly until I and partly until W (``docs/semantics.md``; ``MemorySpec``: F adds
1, I releases ``1 - weights``, W releases ``weights``, B releases 1: the rule is
``semantics.MEMORY``, read here per kind). The rank context logs each action's kind
as it runs (one append); two numbers follow the log when read, O(1) an action, so
that the simulator's held memory is their sum weighted by ``weights``. Within an
overlap step the releases count after the additions, as the simulator counts
them (the actions of an overlap step run together). ``peak(weights)`` is the
largest value seen during the last step for ``weights`` 0, 0.5 or 1.
"""

from __future__ import annotations

from contextlib import contextmanager
from collections.abc import Iterator

from pipeforge.ir import ActionKind
from pipeforge.semantics import MEMORY, memory_effect

WEIGHTS = (0.0, 0.5, 1.0)  # record() spells these out
_F, _B, _I, _W = ActionKind.F, ActionKind.B, ActionKind.I, ActionKind.W


def _effect(kind: ActionKind, recomputed: bool) -> tuple[float, float, float]:
    """What one ``kind`` action adds, releases whole and releases of the weight-gradient part (the rules'
    numbers, read once per kind: ``record`` runs once per action)."""
    added = memory_effect(kind, 0.0, checkpoint=0.0 if recomputed else None)[0]
    _, released, per_weight = MEMORY[kind]
    return added, released, per_weight


_EFFECTS: dict[ActionKind, tuple[float, float, float]] = {}  # per kind, of a microbatch not recomputed
_RECOMPUTED_EFFECTS: dict[ActionKind, tuple[float, float, float]] = {}  # per kind, of one R rebuilds


_OVERLAP_BEGIN, _OVERLAP_END = "overlap begins", "overlap ends"  # the bounds of an overlap step in the log


class ActivationCount:
    """Per rank: what the runtime holds between F and I/W/B, and the peaks during one step.

    Two exact counters, read from ``semantics.MEMORY`` per kind (one M_B per stage, as the
    runtime counts): ``units``, the activations added less those released whole; ``grads``, the
    weight-gradient parts an I left for its W. Held memory is ``units + weights * grads``.

    An action only appends its kind to ``log`` (the rank context appends to it directly: one C call
    an action); the counters and peaks follow the log when they are read."""

    __slots__ = ("log", "_read", "_units", "_grads", "_peaks", "_held_back")

    def __init__(self) -> None:
        self.log: list[ActionKind | tuple[ActionKind, bool] | str] = []  # what ran, in order (``record``)
        self._read = 0  # how much of the log the counters have followed
        self._units = 0.0
        self._grads = 0.0
        self._peaks = [0.0, 0.0, 0.0]  # of held for weights 0, 0.5, 1 (halves of small integers: exact)
        self._held_back: list[float] | None = None  # releases of the overlap step in progress

    @property
    def units(self) -> float:
        self._follow()
        return self._units

    @property
    def grads(self) -> float:
        self._follow()
        return self._grads

    @property
    def awaiting_input(self) -> int:
        """Forwards whose B or I has not run yet."""
        return int(self.units)

    @property
    def awaiting_weight(self) -> int:
        """Forwards whose B or W has not run yet."""
        return int(self.units + self.grads)

    def record(self, kind: ActionKind, recomputed: bool = False) -> None:
        """One ``kind`` action ran: its additions now, its releases now or at the end of the overlap step
        (``recomputed``: an F whose microbatch R rebuilds, counted as ``semantics.memory_effect`` counts it
        with a checkpoint of 0: the runtime counts microbatches, not bytes; ``Pipeline.saved_peak`` has
        the bytes)."""
        self.log.append((kind, True) if recomputed else kind)

    def forward(self) -> None:
        self.record(_F)

    def backward(self) -> None:
        self.record(_B)

    def backward_input(self) -> None:
        self.record(_I)

    def backward_weight(self) -> None:
        self.record(_W)

    @contextmanager
    def overlap(self) -> Iterator[None]:
        """The actions inside run as one step: additions first, then releases."""
        self.log.append(_OVERLAP_BEGIN)
        try:
            yield
        finally:
            self.log.append(_OVERLAP_END)

    def peak(self, weights: float) -> float:
        """The most activations held at once during the step, in units of one microbatch on one stage."""
        if weights not in WEIGHTS:
            raise ValueError(f"peaks are kept for weights {WEIGHTS}, not {weights!r}")
        self._follow()
        return self._peaks[WEIGHTS.index(weights)]

    def _follow(self) -> None:
        """The counters and peaks after every action logged so far."""
        log = self.log
        for entry in log[self._read:]:
            if entry is _OVERLAP_BEGIN:
                self._held_back = [0.0, 0.0]
            elif entry is _OVERLAP_END:
                held, self._held_back = self._held_back, None
                if held is not None:
                    self._release(*held)
            elif isinstance(entry, tuple):
                self._count(*entry)
            else:
                assert isinstance(entry, ActionKind)
                self._count(entry, False)
        self._read = len(log)

    def _count(self, kind: ActionKind, recomputed: bool) -> None:
        effects = _RECOMPUTED_EFFECTS if recomputed else _EFFECTS
        effect = effects.get(kind)
        if effect is None:
            effect = effects[kind] = _effect(kind, recomputed)
        added, released, per_weight = effect
        if added:
            units = self._units = self._units + added
            grads, peaks = self._grads, self._peaks  # WEIGHTS: 0, 0.5, 1
            if units > peaks[0]:
                peaks[0] = units
            if units + 0.5 * grads > peaks[1]:
                peaks[1] = units + 0.5 * grads
            if units + grads > peaks[2]:
                peaks[2] = units + grads
        if released or per_weight:
            self._release(released, per_weight)

    def _release(self, released: float, per_weight: float) -> None:
        # held = units + weights * grads releases ``released + weights * per_weight`` (semantics.memory_effect
        # with activation 1): I releases 1 and -1 gradient part (it leaves that part behind), W 1 gradient part
        if self._held_back is not None:
            self._held_back[0] += released
            self._held_back[1] += per_weight
            return
        self._units -= released
        self._grads -= per_weight
