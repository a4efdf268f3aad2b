"""defer_recv: post each receive just before the compute that needs it (torch's ``defer_pp_recv``).

``defer_recv(schedule)`` (lowered first if compute-only) -> each receive moved out of its group to a
step of its own right before the first compute that consumes it, keeping rank parity (a rank posts its
deferred receives from a higher rank before sending to it) and FIFO order per peer, so the result stays
matched and deadlock-free (valid under ``buffered``). Sends, REDUCE_GRAD, UNSHARD and RESHARD stay;
a receive nothing consumes stays at the end of its rank. How, and where torch differs:
``docs/passes.md``.
"""

from __future__ import annotations

from pipeforge.ir import Action, Schedule, Step, as_action, replace_programs
from pipeforge.passes.lower import lower
from pipeforge.semantics import RECEIVES, needs, peer_stage


def defer_recv(schedule: Schedule) -> Schedule:
    """``schedule`` (lowered first if compute-only) with every receive posted as late as it may be."""
    lowered = lower(schedule)
    programs = tuple(Deferral(rank, lowered).program(program) for rank, program in enumerate(lowered.programs))
    return replace_programs(lowered, programs)


class Deferral:
    """One rank's walk over its program: receives wait in ``deferred`` until needed."""

    def __init__(self, rank: int, schedule: Schedule):
        self.rank = rank
        self.schedule = schedule
        self.deferred: list[tuple[Action, Step]] = []  # (receive, the step it came from), in posting order
        self.out: list[Step] = []

    def program(self, program: tuple[Step, ...]) -> tuple[Step, ...]:
        for step in program:
            if step.is_group:
                self.group(step)
            else:
                self.other(step)
        self.flush(lambda position, receive: True)
        return tuple(self.out)

    def group(self, step: Step) -> None:
        for action in step.actions:
            if action.kind in RECEIVES:
                self.deferred.append((action, step))
        sends = tuple(action for action in step.actions if action.kind not in RECEIVES)
        if not sends:
            return
        for send in sends:
            peer = self.peer(send)
            if peer is not None and self.rank < peer:
                self.flush(lambda position, receive, peer=peer: self.peer(receive) == peer)
        self.out.append(Step(sends, span=step.span))

    def other(self, step: Step) -> None:
        if step.is_compute:
            for action in step.actions:
                needed = consumed_receive(action, self.schedule.stages)
                if needed is not None and any(receive == needed for receive, _ in self.deferred):
                    self.flush_through(needed)
        self.out.append(step)

    def flush(self, chosen) -> None:
        """Post the deferred receives ``chosen(position, receive)`` picks, in posting order."""
        kept = []
        for position, (receive, origin) in enumerate(self.deferred):
            if chosen(position, receive):
                self.out.append(Step((receive,), span=origin.span))
            else:
                kept.append((receive, origin))
        self.deferred = kept

    def flush_through(self, needed: Action) -> None:
        """Post ``needed`` and, first, the receives from the same rank deferred before it."""
        peer = self.peer(needed)
        cut = next(i for i, (receive, _) in enumerate(self.deferred) if receive == needed)
        self.flush(lambda position, receive: position <= cut and self.peer(receive) == peer)

    def peer(self, action: Action) -> int | None:
        stages = self.schedule.stages
        peer = peer_stage(action)
        if not 0 <= peer < stages or not 0 <= action.chain < self.schedule.chains:
            return None
        return self.schedule.rank_of(peer, action.chain)


def consumed_receive(action: Action, stages: int) -> Action | None:
    """The receive that carries ``action``'s input from another rank, were there one (``semantics.needs``)."""
    for _, _, receive in needs(action, stages):
        if receive is not None:
            return as_action(receive)
    return None
