"""The optional passes a command asks for, applied in one fixed order (torch's where it has one).

``merge_bw`` first (it changes the compute steps the others look at), then
``unshard`` and ``reduce_grad`` (torch's ``_prepare_schedule_with_comms`` runs them
in this order on the compute-only schedule), then, when asked, ``lower`` (which
inserts communication), and ``defer_recv`` last (it moves the receives that
lowering posted; it lowers a compute-only schedule itself).
"""

from __future__ import annotations

from dataclasses import dataclass

from pipeforge.ir import Schedule
from pipeforge.passes.defer_recv import defer_recv
from pipeforge.passes.lower import lower as lower_pass
from pipeforge.passes.merge_bw import merge_bw
from pipeforge.passes.reduce_grad import reduce_grad
from pipeforge.passes.unshard import unshard


@dataclass(frozen=True)
class PassOptions:
    unshard: int | None = None  # max_active_stages; None: no UNSHARD/RESHARD
    reduce_grad: bool = False
    merge_bw: bool = False
    defer_recv: bool = False

    @property
    def any(self) -> bool:
        return self.unshard is not None or self.reduce_grad or self.merge_bw or self.defer_recv


def apply_passes(schedule: Schedule, options: PassOptions, *, lower: bool = False) -> Schedule:
    """``schedule`` through the passes ``options`` names; ``lower=True`` also inserts communication."""
    if options.merge_bw:
        schedule = merge_bw(schedule)
    if options.unshard is not None:
        schedule = unshard(schedule, options.unshard)
    if options.reduce_grad:
        schedule = reduce_grad(schedule)
    if lower:
        schedule = lower_pass(schedule)
    if options.defer_recv:
        schedule = defer_recv(schedule)
    return schedule
