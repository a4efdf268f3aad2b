"""One rank's program while it is being elaborated, and the implicit microbatch.

``F(s)`` without a microbatch means the lowest microbatch of stage s (on this
chain) that this rank has not forwarded yet; ``B(s)`` and ``I(s)`` the lowest
not yet run backward (by B or I); ``W(s)`` the oldest microbatch whose I has
run and whose W has not. Explicit actions and torch tokens count too, so a
file may mix both styles.
"""

from __future__ import annotations

from pipeforge.errors import SemanticError, Span
from pipeforge.ir import Action, ActionKind, Step

_F, _B, _I, _W = ActionKind.F, ActionKind.B, ActionKind.I, ActionKind.W
IMPLICIT_KINDS = frozenset({_F, _B, _I, _W})  # the kinds whose microbatch may be left out: F(s), B(s), I(s), W(s)


class _Counter:
    """Microbatches done so far for one (chain, stage), and the lowest not done."""

    __slots__ = ("done", "lowest")

    def __init__(self) -> None:
        self.done: set[int] = set()
        self.lowest = 0

    def mark(self, microbatch: int) -> None:
        self.done.add(microbatch)

    def next(self) -> int:
        while self.lowest in self.done:
            self.lowest += 1
        return self.lowest


class RankBuilder:
    """The steps of one rank so far, and what its implicit microbatches have consumed."""

    __slots__ = ("rank", "steps", "recorded", "_counted", "_forwarded", "_backwarded", "_awaiting_w")

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.steps: list[Step] = []
        # the compute actions so far, in order (``recorded.append``: cheaper than ``record``); counted
        # for the implicit microbatches only when one is asked for, so a file that writes every
        # microbatch never counts them
        self.recorded: list[Action] = []
        self._counted = 0
        self._forwarded: dict[tuple[int, int], _Counter] = {}
        self._backwarded: dict[tuple[int, int], _Counter] = {}
        self._awaiting_w: dict[tuple[int, int], dict[int, None]] = {}

    def record(self, action: Action) -> None:
        """Note a compute action for the implicit microbatches that follow it."""
        self.recorded.append(action)

    def _count(self) -> None:
        """Count the compute actions recorded since the last implicit microbatch, in order."""
        recorded = self.recorded
        for index in range(self._counted, len(recorded)):
            self._count_one(recorded[index])
        self._counted = len(recorded)

    def _count_one(self, action: Action) -> None:
        kind, microbatch = action.kind, action.microbatch
        if microbatch is None:  # none of F, B, I, W: each has its microbatch (parse_action, or implicit)
            return
        key = (action.chain, action.stage)
        if kind is _F:
            self._counter(self._forwarded, key).mark(microbatch)
        elif kind is _B or kind is _I:
            self._counter(self._backwarded, key).mark(microbatch)
            if kind is _I:
                self._awaiting_w.setdefault(key, {})[microbatch] = None
        elif kind is _W:
            self._awaiting_w.get(key, {}).pop(microbatch, None)

    def implicit_microbatch(self, kind: ActionKind, stage: int, chain: int, microbatches: int, span: Span) -> int:
        """The microbatch ``kind(stage)`` stands for here, or a SemanticError when none is left."""
        if self._counted < len(self.recorded):
            self._count()
        key = (chain, stage)
        if kind is _W:
            return self._oldest_awaiting_w(key, stage, span)
        table = self._forwarded if kind is _F else self._backwarded
        microbatch = self._counter(table, key).next()
        if microbatch >= microbatches:
            done = "forwarded" if kind is _F else "run backward"
            raise SemanticError(
                f"{kind.value}({stage}) has no microbatch left: rank {self.rank} has already {done} "
                f"all {microbatches} microbatches of stage {stage}{_chain_note(chain)}", span)
        return microbatch

    def _oldest_awaiting_w(self, key: tuple[int, int], stage: int, span: Span) -> int:
        waiting = self._awaiting_w.get(key)
        if not waiting:
            raise SemanticError(
                f"W({stage}) has no microbatch left: rank {self.rank} has no microbatch of stage "
                f"{stage}{_chain_note(key[0])} whose I has run and whose W has not", span)
        return next(iter(waiting))

    @staticmethod
    def _counter(table: dict[tuple[int, int], _Counter], key: tuple[int, int]) -> _Counter:
        counter = table.get(key)
        if counter is None:
            counter = table[key] = _Counter()
        return counter


def _chain_note(chain: int) -> str:
    return f" on chain {chain}" if chain else ""
