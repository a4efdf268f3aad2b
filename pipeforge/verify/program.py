"""The verifier's view of a schedule: each rank's non-idle steps with the place to report them at."""

from __future__ import annotations

from dataclasses import dataclass, field

from pipeforge.errors import Span
from pipeforge.ir import Action, ActionKind, Schedule, Step
from pipeforge.verify.report import Violation


@dataclass(frozen=True)
class Slot:
    """A non-idle step of one rank: ``number`` orders it, ``index`` is what reports name."""

    rank: int
    number: int
    index: int
    step: Step
    text: str
    span: Span | None = field(default=None, compare=False)


@dataclass(frozen=True)
class Program:
    """The schedule being checked (lowered when the input was compute-only) and its slots."""

    schedule: Schedule
    slots: tuple[tuple[Slot, ...], ...]
    as_written: bool  # communication written by the user (else inserted by lower)

    @staticmethod
    def of(checked: Schedule, origins: tuple[tuple[int, ...], ...], written: Schedule) -> Program:
        as_written = checked is written
        slots = []
        for rank, program in enumerate(checked.programs):
            row = []
            for position, step in enumerate(program):
                if step.is_idle:
                    continue
                index = origins[rank][position]
                shown = step if as_written else written.programs[rank][index]
                row.append(Slot(rank, len(row), index, step, str(shown), step.span))
            slots.append(tuple(row))
        return Program(checked, tuple(slots), as_written)

    def actions(self):
        """Every (slot, action) in rank order, then program order, then written order."""
        for row in self.slots:
            for slot in row:
                for action in slot.step.actions:
                    yield slot, action

    def rank_of(self, stage: int, chain: int = 0) -> int | None:
        """The rank owning ``stage`` in ``chain``, or None when either is out of range."""
        placements = self.schedule.placements
        if not 0 <= chain < len(placements) or not 0 <= stage < len(placements[chain].stage_to_rank):
            return None
        return placements[chain].rank_of(stage)

    def in_range(self, action: Action) -> bool:
        sched = self.schedule
        if not 0 <= action.chain < sched.chains or not 0 <= action.stage < sched.stages:
            return False
        return action.microbatch is None or 0 <= action.microbatch < sched.microbatches

    def peer_rank(self, action: Action) -> int | None:
        return self.rank_of(action.peer_stage(), action.chain)

    def step_count(self) -> int:
        return sum(len(row) for row in self.slots)


def violation_at(kind: str, message: str, slot: Slot) -> Violation:
    location = str(slot.span) if slot.span else None
    return Violation(kind, message, slot.rank, slot.index, location, slot.span)


def expected_partner(action: Action) -> Action:
    """The action the other rank must post to meet ``action``."""
    partner_kind = {
        ActionKind.SEND_F: ActionKind.RECV_F, ActionKind.RECV_F: ActionKind.SEND_F,
        ActionKind.SEND_B: ActionKind.RECV_B, ActionKind.RECV_B: ActionKind.SEND_B,
    }[action.kind]
    return Action(action.peer_stage(), partner_kind, action.microbatch, action.chain)
