"""Passes as named objects, applied by a pipeline in torch's order, with a callback after each.

Each pass is a frozen dataclass with a kebab-case ``name`` (its command-line flag) and
``apply(schedule) -> schedule``; ``PASSES`` registers them by name, in torch's order: ``merge-bw``
first (it changes the compute steps the others look at), then ``unshard`` and ``reduce-grad``
(torch's ``_prepare_schedule_with_comms`` runs them in this order on the compute-only schedule),
then ``lower`` (which inserts communication), and ``defer-recv`` last (it moves the receives that
lowering posted; it lowers a compute-only schedule itself). ``PassPipeline(passes, callback)``
applies them and calls ``callback(pass, schedule)`` after each (``--verify-each`` verifies there).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

from pipeforge.ir import Schedule
from pipeforge.passes.defer_recv import defer_recv
from pipeforge.passes.lower import lower as lower_pass
from pipeforge.passes.merge_bw import merge_bw
from pipeforge.passes.reduce_grad import reduce_grad
from pipeforge.passes.unshard import unshard


@dataclass(frozen=True)
class SchedulePass:
    """A pass: a schedule in, a new schedule out."""

    name: ClassVar[str]

    def apply(self, schedule: Schedule) -> Schedule:
        raise NotImplementedError


@dataclass(frozen=True)
class MergeBw(SchedulePass):
    """An I directly followed by its W becomes one B."""

    name: ClassVar[str] = "merge-bw"

    def apply(self, schedule: Schedule) -> Schedule:
        return merge_bw(schedule)


@dataclass(frozen=True)
class Unshard(SchedulePass):
    """UNSHARD each stage's parameters before use and RESHARD after, at most ``max_active_stages`` gathered."""

    name: ClassVar[str] = "unshard"
    max_active_stages: int = 3

    def apply(self, schedule: Schedule) -> Schedule:
        return unshard(schedule, self.max_active_stages)


@dataclass(frozen=True)
class ReduceGrad(SchedulePass):
    """REDUCE_GRAD after each stage's last backward on each rank where it is not written."""

    name: ClassVar[str] = "reduce-grad"

    def apply(self, schedule: Schedule) -> Schedule:
        return reduce_grad(schedule)


@dataclass(frozen=True)
class Lower(SchedulePass):
    """Insert the send/receive groups (and REDUCE_GRAD) of a compute-only schedule."""

    name: ClassVar[str] = "lower"

    def apply(self, schedule: Schedule) -> Schedule:
        return lower_pass(schedule)


@dataclass(frozen=True)
class DeferRecv(SchedulePass):
    """Post each receive just before the compute that needs it (torch's ``defer_pp_recv``)."""

    name: ClassVar[str] = "defer-recv"

    def apply(self, schedule: Schedule) -> Schedule:
        return defer_recv(schedule)


PASSES: dict[str, type[SchedulePass]] = {cls.name: cls for cls in (MergeBw, Unshard, ReduceGrad, Lower, DeferRecv)}
"""Every pass by name, in the order a pipeline applies them (torch's)."""

Callback = Callable[[SchedulePass, Schedule], None]


@dataclass(frozen=True)
class PassPipeline:
    """``passes`` applied in turn; ``callback(pass, schedule)`` after each, with the schedule it made."""

    passes: tuple[SchedulePass, ...]
    callback: Callback | None = None

    def apply(self, schedule: Schedule) -> Schedule:
        for schedule_pass in self.passes:
            schedule = schedule_pass.apply(schedule)
            if self.callback is not None:
                self.callback(schedule_pass, schedule)
        return schedule


@dataclass(frozen=True)
class PassOptions:
    """The passes a command line asks for."""

    unshard: int | None = None  # max_active_stages; None: no UNSHARD/RESHARD
    reduce_grad: bool = False
    merge_bw: bool = False
    defer_recv: bool = False

    @property
    def any(self) -> bool:
        return self.unshard is not None or self.reduce_grad or self.merge_bw or self.defer_recv

    def passes(self, *, lower: bool = False) -> tuple[SchedulePass, ...]:
        """The passes asked for (``lower``: and communication inserted), in ``PASSES``' order."""
        asked: dict[str, SchedulePass] = {}
        if self.merge_bw:
            asked[MergeBw.name] = MergeBw()
        if self.unshard is not None:
            asked[Unshard.name] = Unshard(self.unshard)
        if self.reduce_grad:
            asked[ReduceGrad.name] = ReduceGrad()
        if lower:
            asked[Lower.name] = Lower()
        if self.defer_recv:
            asked[DeferRecv.name] = DeferRecv()
        return tuple(asked[name] for name in PASSES if name in asked)


def apply_passes(schedule: Schedule, options: PassOptions, *, lower: bool = False,
                 callback: Callback | None = None) -> Schedule:
    """``schedule`` through the passes ``options`` names; ``lower=True`` also inserts communication."""
    return PassPipeline(options.passes(lower=lower), callback).apply(schedule)
