"""The verifier's view of a schedule: each rank's non-idle steps with the place to report them at."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property, partial
from itertools import chain, compress
from operator import attrgetter, itemgetter
from typing import NamedTuple

from pipeforge.errors import Span
from pipeforge.ir import COMM_KINDS, COMPUTE_KINDS, ActionKind, Schedule, Step, as_action
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
            if not all_in_range(program, in_range, microbatches):
                bad.update(key for step in program for key in step.actions if not in_range_key(key, in_range,
                                                                                               microbatches))
            for position, step in enumerate(program):
                acts = step.actions
                if not acts:
                    continue  # an idle slot means nothing
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

    @cached_property
    def compute(self) -> frozenset[ActionKey]:
        """Every compute action of the program, found in C (``COMPUTE_KINDS`` by each action's kind);
        made once, asked by several checks."""
        keys = list(_flatten(map(_acts_of, _flatten(self.slots))))
        return frozenset(compress(keys, map(COMPUTE_KINDS.__contains__, map(_kind_of, keys))))

    def rank_of(self, stage: int, chain: int = 0) -> int | None:
        """The rank owning ``stage`` in ``chain``, or None when either is out of range."""
        owners = self.owners
        if not 0 <= chain < len(owners) or not 0 <= stage < len(owners[chain]):
            return None
        return owners[chain][stage]

    def step_count(self) -> int:
        return sum(len(row) for row in self.slots)


def in_range_key(key: ActionKey, in_range: frozenset, microbatches: range) -> bool:
    stage, kind, mb, chain = key
    return (stage, kind, chain) in in_range and (mb is None or mb in microbatches)


def all_in_range(program: tuple[Step, ...], in_range: frozenset, microbatches: range) -> bool:
    """Whether every action of a rank's program is ``in_range_key``, decided by sets (built in C)."""
    keys = list(_flatten(map(_actions_of, program)))
    if not in_range.issuperset(map(_stage_kind_chain, keys)):
        return False
    found = set(map(_microbatch_of, keys))
    found.discard(None)
    if not all(type(mb) is int for mb in found):
        return False
    return not found or (min(found) >= microbatches.start and max(found) < microbatches.stop)


_flatten, _actions_of, _acts_of = chain.from_iterable, attrgetter("actions"), attrgetter("acts")
_stage_kind_chain, _microbatch_of, _kind_of = itemgetter(0, 1, 3), itemgetter(2), itemgetter(1)


def stages_in_range(schedule: Schedule) -> frozenset[tuple[int, ActionKind, int]]:
    """(stage, kind, chain) of every action whose stage and chain exist, and, for a send or receive,
    whose peer stage exists too (a set looked up once per action: a third quicker than range tests)."""
    stages = range(schedule.stages)
    return frozenset((stage, kind, chain) for chain in range(schedule.chains) for kind in ActionKind
                     for stage in stages if stage + PEER_OFFSET.get(kind, 0) in stages)


def violation_at(kind: str, message: str, slot: Slot) -> Violation:
    location = str(slot.span) if slot.span else None
    return Violation(kind, message, slot.rank, slot.index, location, slot.span)
