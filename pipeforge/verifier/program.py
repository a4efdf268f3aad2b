"""The verifier's view of a schedule: each rank's non-idle steps with the place to report them at."""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import NamedTuple

from pipeforge.errors import Span
from pipeforge.ir import COMM_KINDS, ActionKind, Schedule, Step, as_action
from pipeforge.semantics import PEER_OFFSET, ActionKey
from pipeforge.semantics import partner as partner_key  # noqa: F401 (matching and timing use it from here)
from pipeforge.verifier.report import Violation


def text_of(key: ActionKey) -> str:
    """An action's text (``2F0``), whether ``key`` is an Action or a plain tuple equal to one."""
    return str(as_action(key))


class Slot(NamedTuple):
    """A non-idle step of one rank: ``number`` orders it, ``index`` is what reports name.

    ``shown`` is the step the user wrote there (the compute step a lowered group serves).
    """

    rank: int
    number: int
    index: int  # type: ignore[assignment]  # (the step's index in its program, not tuple.index)
    step: Step
    shown: Step
    span: Span | None
    acts: tuple[ActionKey, ...]  # the step's actions (Actions: cheap to hash and compare)
    group: bool

    @property
    def text(self) -> str:
        return str(self.shown)


@dataclass(frozen=True)
class Program:
    """The schedule being checked (lowered when the input was compute-only) and its slots."""

    schedule: Schedule
    slots: tuple[tuple[Slot, ...], ...]
    as_written: bool  # communication written by the user (else inserted by lower)
    owners: tuple[tuple[int, ...], ...]  # per chain: stage -> rank
    out_of_range: frozenset  # action keys whose stage, microbatch, chain or peer stage does not exist

    @staticmethod
    def of(checked: Schedule, origins: tuple[tuple[int, ...], ...], written: Schedule) -> Program:
        as_written = checked is written
        slots = []
        bad: set[ActionKey] = set()
        in_range, microbatches = stages_in_range(checked), range(checked.microbatches)
        new_slot = partial(tuple.__new__, Slot)
        for rank, program in enumerate(checked.programs):
            row: list[Slot] = []
            shown_steps = program if as_written else written.programs[rank]
            origin = origins[rank]
            for position, step in enumerate(program):
                acts = step.actions
                if not acts:
                    continue  # an idle slot means nothing
                for key in acts:
                    stage, kind, mb, chain = key
                    if (stage, kind, chain) not in in_range or (mb is not None and mb not in microbatches):
                        bad.add(key)
                index = origin[position]
                row.append(new_slot((rank, len(row), index, step, shown_steps[index], step.span, acts,
                                     acts[0][1] in COMM_KINDS)))
            slots.append(tuple(row))
        owners = tuple(p.stage_to_rank for p in checked.placements)
        return Program(checked, tuple(slots), as_written, owners, frozenset(bad))

    def actions(self):
        """Every (slot, action key) in rank order, then program order, then written order."""
        for row in self.slots:
            for slot in row:
                for key in slot.acts:
                    yield slot, key

    def rank_of(self, stage: int, chain: int = 0) -> int | None:
        """The rank owning ``stage`` in ``chain``, or None when either is out of range."""
        owners = self.owners
        if not 0 <= chain < len(owners) or not 0 <= stage < len(owners[chain]):
            return None
        return owners[chain][stage]

    def step_count(self) -> int:
        return sum(len(row) for row in self.slots)


def stages_in_range(schedule: Schedule) -> frozenset[tuple[int, ActionKind, int]]:
    """(stage, kind, chain) of every action whose stage and chain exist, and, for a send or receive,
    whose peer stage exists too (a set looked up once per action: a third quicker than range tests)."""
    stages = range(schedule.stages)
    return frozenset((stage, kind, chain) for chain in range(schedule.chains) for kind in ActionKind
                     for stage in stages if stage + PEER_OFFSET.get(kind, 0) in stages)


def violation_at(kind: str, message: str, slot: Slot) -> Violation:
    location = str(slot.span) if slot.span else None
    return Violation(kind, message, slot.rank, slot.index, location, slot.span)
