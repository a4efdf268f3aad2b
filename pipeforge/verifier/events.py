"""The linear-time pass: run the ranks as events, propose a timing or find the wait cycle.

``run(program, pairing, semantics)`` -> ``Timing`` (a start time for every slot) or ``Stuck`` (the wait
cycle, hop by hop). ``model_constraints(program, pairing, semantics)``: the timing model
(``docs/semantics.md``, Execution) as plain tuples, folded (durations eliminated, compute steps between
groups folded away: satisfiable exactly when the full model is), the one list that feeds the z3 text
(``model.py``) and the unsat-core mapping. The tuples and why folding is exact: ``docs/verifier.md``.
"""

from __future__ import annotations

from collections import defaultdict, deque
from dataclasses import dataclass

from pipeforge.semantics import Semantics
from pipeforge.verifier.matching import Op, Pairing
from pipeforge.verifier.program import Program, Slot, partner_key, text_of

SlotRef = tuple[int, int]  # a slot, as (rank, slot number)
Constraint = tuple


@dataclass(frozen=True)
class Timing:
    """A proposed start and duration for every slot (the certificate z3 checks)."""

    start: tuple[tuple[int, ...], ...]
    duration: tuple[tuple[int, ...], ...]


@dataclass(frozen=True)
class Wait:
    """One link of a wait chain, found by the pass."""

    slot: Slot
    waits_for: str
    peer: int | None
    target: SlotRef | None  # the partner's slot, None when nothing will ever meet the op
    links: tuple[Constraint, ...]  # the match constraint to the target (or the unmatched op)
    peer_finished: bool
    posted: bool = False  # the awaited op is posted (its group is at its rank's head): the chain goes on there


@dataclass(frozen=True)
class Stuck:
    """Where each rank stopped and the wait chain from the lowest stuck rank."""

    position: tuple[int, ...]
    chain: tuple[Wait, ...]
    cycle_from: int | None  # index in chain where the cycle starts (None: ends at a finished rank)

    def cycle_constraints(self) -> list[Constraint]:
        """The constraints along the cycle, or the op nothing will meet when the chain has one."""
        for wait in self.chain:
            if wait.target is None:
                return list(wait.links)
        found: list[Constraint] = []
        for wait in self.chain[self.cycle_from:]:
            found.extend(wait.links)
            if wait.posted:  # a group the component passes through: it is at its rank's head
                continue
            assert wait.target is not None, "a chain with a wait for nothing returned above"
            rank, target = wait.target
            found.append(("after", rank, self.position[rank], target))
            found.append(("duration", rank, self.position[rank]))
        return found


def key_of(slot: Slot) -> SlotRef:
    return (slot.rank, slot.number)


def group_slots(program: Program) -> list[list[int]]:
    return [[slot.number for slot in row if slot.group] for row in program.slots]


def model_constraints(program: Program, pairing: Pairing, semantics: Semantics) -> list[Constraint]:
    """The folded timing model over group slots (the certificate is checked against these)."""
    groups = group_slots(program)
    found: list[Constraint] = [("gap", rank, k, j) for rank, numbers in enumerate(groups)
                               for k, j in zip(numbers, numbers[1:])]
    if semantics is Semantics.RENDEZVOUS:
        found += [("rendezvous", send.at, recv.at) for send, recv in pairing.matches]
    else:
        found += released(found, pairing, semantics)
    for op in pairing.unmatched:
        if semantics is not Semantics.BUFFERED or not op.is_send:
            found.append(("unmatched", op.at, op.text))
    return found


def released(gaps: list[Constraint], pairing: Pairing, semantics: Semantics) -> list[Constraint]:
    """Buffered and nccl: the group after a waiting op's group starts once its partner's group is posted."""
    following = {(rank, k): j for _, rank, k, j in gaps}
    found = []
    for send, recv in pairing.matches:
        waiting = ((recv, send), (send, recv)) if semantics is Semantics.NCCL else ((recv, send),)
        for op, partner in waiting:  # op's group ends after partner's group is posted
            rank, k = op.at
            if (rank, k) in following:
                j = following[(rank, k)]
                found.append(("released", (rank, j), partner.at, j - k))
    return found


def run(program: Program, pairing: Pairing, semantics: Semantics) -> Timing | Stuck:
    runner = RUNNERS[semantics](program, pairing)
    runner.run()
    return runner.result()


class Runner:
    """Shared event loop: each rank runs until it blocks; blocked ranks are woken by others."""

    arrives = False  # whether ``arrive`` does anything (the loop skips the call when not)

    def __init__(self, program: Program, pairing: Pairing):
        self.program = program
        self.pairing = pairing
        self.slots = program.slots
        self.position = [0] * len(self.slots)
        self.ready = [0] * len(self.slots)
        self.start = [[0] * len(row) for row in self.slots]
        self.duration = [[1] * len(row) for row in self.slots]
        self.queue = deque(range(len(self.slots)))

    def run(self) -> None:
        slots, position, ready, start, queue = self.slots, self.position, self.ready, self.start, self.queue
        arrives, try_group = self.arrives, self.try_group
        while queue:
            rank = queue.popleft()
            row, k, now, starts = slots[rank], position[rank], ready[rank], start[rank]
            end = len(row)
            while k < end:
                if not row[k].group:  # compute and stage-only steps never block: duration 1
                    starts[k] = now
                    now += 1
                    k += 1
                    continue
                position[rank], ready[rank] = k, now
                if arrives:
                    self.arrive(rank)
                if not try_group(row[k]):
                    break
                k, now = position[rank], ready[rank]
            position[rank], ready[rank] = k, now

    def finish(self, rank: int, start: int, duration: int) -> None:
        k = self.position[rank]
        self.start[rank][k] = start
        self.duration[rank][k] = duration
        self.ready[rank] = start + duration
        self.position[rank] = k + 1

    def arrive(self, rank: int) -> None:
        """Hook: ``rank`` has reached the group slot at its position."""

    def try_group(self, slot: Slot) -> bool:
        raise NotImplementedError

    def ops(self, slot: Slot) -> list[tuple[Op, Op | None]]:
        """(op, its partner or None) for each valid communication action of a group slot."""
        return self.pairing.ops_of((slot.rank, slot.number))

    def at_head(self, key: SlotRef) -> bool:
        return self.position[key[0]] == key[1]

    def finished(self, rank: int) -> bool:
        """Done with its program (a rank the placement names but that has no program counts as done)."""
        return rank >= len(self.slots) or self.position[rank] >= len(self.slots[rank])

    def result(self) -> Timing | Stuck:
        if all(self.finished(r) for r in range(len(self.slots))):
            return Timing(tuple(map(tuple, self.start)), tuple(map(tuple, self.duration)))
        return self.stuck()

    def stuck(self) -> Stuck:
        """The wait chain from the lowest stuck rank, until a rank (or a group passed through) repeats."""
        rank = min(r for r in range(len(self.slots)) if not self.finished(r))
        seen: dict[int, int] = {}
        at: dict[SlotRef, int] = {}  # group slot -> index of its hop in the chain
        chain: list[Wait] = []
        while rank not in seen:
            seen[rank] = len(chain)
            for wait in self.blocker(self.slots[rank][self.position[rank]]):
                here = key_of(wait.slot)
                if here in at and wait.slot.rank != rank:  # back at a group of the chain: the cycle
                    return Stuck(tuple(self.position), tuple(chain), at[here])
                at.setdefault(here, len(chain))
                chain.append(wait)
            if wait.peer_finished:
                return Stuck(tuple(self.position), tuple(chain), None)
            assert wait.peer is not None, "a wait without a peer has peer_finished (unmatched_wait)"
            rank = wait.peer
        return Stuck(tuple(self.position), tuple(chain), seen[rank])

    def blocker(self, slot: Slot) -> list[Wait]:
        """Why the group ``slot`` cannot complete: the groups it passes through, then the op not posted."""
        raise NotImplementedError

    def unmatched_wait(self, slot: Slot, op: Op) -> Wait:
        link = ("unmatched", op.at, op.text)
        ended = op.peer is None or self.finished(op.peer)
        return Wait(slot, text_of(partner_key(op.key)), op.peer, None, (link,), ended)


def components(pairing: Pairing) -> dict[SlotRef, list[SlotRef]]:
    """Group slots joined by matches: each maps to the one shared list of its component's members."""
    members: dict[SlotRef, list[SlotRef]] = {}
    for send, recv in pairing.matches:
        a, b = send.at, recv.at
        la, lb = members.get(a), members.get(b)
        if la is None:
            if lb is None:
                members[a] = members[b] = [a] if a == b else [a, b]
            else:
                lb.append(a)
                members[a] = lb
        elif lb is None:
            la.append(b)
            members[b] = la
        elif la is not lb:
            big, small = (la, lb) if len(la) >= len(lb) else (lb, la)
            big.extend(small)
            for key in small:
                members[key] = big
    return members


class Rendezvous(Runner):
    """Matched groups form components; a component fires when all its groups are at their ranks' heads."""

    def __init__(self, program: Program, pairing: Pairing):
        super().__init__(program, pairing)
        self.members = components(pairing)
        # groups holding an op nothing will meet never fire (nor does their component)
        self.poisoned_keys = {op.at for op in pairing.unmatched}
        self.poisoned = {id(self.members[key]) for key in self.poisoned_keys if key in self.members}
        self.arrived: dict[int, int] = {}

    def try_group(self, slot: Slot) -> bool:
        key = (slot.rank, slot.number)
        members = self.members.get(key)
        if members is None:  # a group matched with nothing
            if key in self.poisoned_keys:
                return False
            self.finish(slot.rank, self.ready[slot.rank], 1)
            return True
        label = id(members)
        arrived = self.arrived[label] = self.arrived.get(label, 0) + 1
        if arrived < len(members) or label in self.poisoned:
            return False
        ready, position, start, duration = self.ready, self.position, self.start, self.duration
        when = 0  # the latest of the members' ready times (a loop: a component holds a few groups)
        for rank, _ in members:
            if ready[rank] > when:
                when = ready[rank]
        for rank, _ in members:  # each member is its rank's current step: finish it (duration 1)
            k = position[rank]
            start[rank][k] = when
            duration[rank][k] = 1
            ready[rank] = when + 1
            position[rank] = k + 1
            if rank != slot.rank:
                self.queue.append(rank)
        return True

    def blocker(self, slot: Slot) -> list[Wait]:
        """The first op, breadth-first through the component, whose partner is not posted, and
        every group of the component on the way there (each is a hop of the wait chain)."""
        todo: deque[tuple[Slot, tuple[Wait, ...]]] = deque([(slot, ())])
        visited = {key_of(slot)}
        while todo:
            here, path = todo.popleft()
            for op, partner in self.ops(here):
                if partner is None:
                    return list(path) + [self.unmatched_wait(here, op)]
                there = partner.at
                link = ("rendezvous", key_of(here), there)
                if not self.at_head(there):
                    return list(path) + [Wait(here, partner.text, partner.slot.rank, there, (link,), False)]
                if there not in visited:
                    visited.add(there)
                    passed = Wait(here, partner.text, partner.slot.rank, there, (link,), False, posted=True)
                    todo.append((partner.slot, path + (passed,)))
        raise AssertionError(f"rank {slot.rank} is stuck at {slot.text} with every partner posted")


class Buffered(Runner):
    """Sends complete once posted; a group completes once every receive's send is posted."""

    waits_for_receivers = False  # a send completes once posted
    arrives = True

    def __init__(self, program: Program, pairing: Pairing):
        super().__init__(program, pairing)
        self.posted_at: list[list[int | None]] = [[None] * len(row) for row in self.slots]
        self.waiting: dict[SlotRef, list[int]] = defaultdict(list)

    def arrive(self, rank: int) -> None:
        k = self.position[rank]
        if self.posted_at[rank][k] is None:
            self.posted_at[rank][k] = self.ready[rank]
            self.queue.extend(self.waiting.pop((rank, k), ()))

    def try_group(self, slot: Slot) -> bool:
        end = self.ready[slot.rank] + 1
        for op, partner in self.ops(slot):
            if op.is_send and not self.waits_for_receivers:
                continue
            if partner is None:
                return False
            rank, k = partner.at
            posted = self.posted_at[rank][k]
            if posted is None:  # the sending rank has not reached that group yet
                self.waiting[(rank, k)].append(slot.rank)
                return False
            end = max(end, posted + 1)
        self.finish(slot.rank, self.ready[slot.rank], end - self.ready[slot.rank])
        return True

    def blocker(self, slot: Slot) -> list[Wait]:
        for op, partner in self.ops(slot):
            if op.is_send and not self.waits_for_receivers:
                continue
            if partner is None:
                return [self.unmatched_wait(slot, op)]
            there = partner.at
            if self.posted_at[there[0]][there[1]] is None:
                link = ("buffered", key_of(slot), there)
                return [Wait(slot, partner.text, there[0], there, (link,), False)]
        raise AssertionError(f"rank {slot.rank} is stuck at {slot.text} with every partner posted")


class Nccl(Buffered):
    """Each op completes once its partner's group is posted (NCCL's steady state: the
    connection exists); a group completes when all its ops do; a rank's next step waits."""

    waits_for_receivers = True


RUNNERS = {Semantics.RENDEZVOUS: Rendezvous, Semantics.BUFFERED: Buffered, Semantics.NCCL: Nccl}
