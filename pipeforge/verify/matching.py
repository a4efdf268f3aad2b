"""NCCL point-to-point matching (tags ignored), and the activation-memory check."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from pipeforge.verify.program import Program, Slot, expected_partner, violation_at
from pipeforge.ir import Action, ActionKind
from pipeforge.verify.report import Violation


@dataclass(frozen=True)
class Op:
    """One send or receive at a slot, with the rank at its other end."""

    slot: Slot
    action: Action
    peer: int

    @property
    def is_send(self) -> bool:
        return self.action.kind in (ActionKind.SEND_F, ActionKind.SEND_B)


@dataclass(frozen=True)
class Pairing:
    """The k-th send from a to b meets the k-th receive on b from a."""

    matches: tuple[tuple[Op, Op], ...]  # (send, recv)
    unmatched: tuple[Op, ...]
    partner: dict[tuple[int, int, int], Op]  # (rank, slot number, position in the group) -> partner op

    def partner_of(self, op_key: tuple[int, int, int]) -> Op | None:
        return self.partner.get(op_key)


def pair_ops(program: Program) -> Pairing:
    sends: dict[tuple[int, int], list[tuple[Op, int]]] = defaultdict(list)
    recvs: dict[tuple[int, int], list[tuple[Op, int]]] = defaultdict(list)
    for row in program.slots:
        for slot in row:
            for position, action in enumerate(slot.step.actions):
                op = op_of(program, slot, action)
                if op is None:
                    continue
                lane = (slot.rank, op.peer) if op.is_send else (op.peer, slot.rank)
                (sends if op.is_send else recvs)[lane].append((op, position))
    matches, unmatched, partner = [], [], {}
    for lane in sorted(set(sends) | set(recvs)):
        out, into = sends.get(lane, []), recvs.get(lane, [])
        for (send, ps), (recv, pr) in zip(out, into):
            matches.append((send, recv))
            partner[(send.slot.rank, send.slot.number, ps)] = recv
            partner[(recv.slot.rank, recv.slot.number, pr)] = send
        longer = out if len(out) > len(into) else into
        unmatched.extend(op for op, _ in longer[min(len(out), len(into)):])
    return Pairing(tuple(matches), tuple(unmatched), partner)


def op_of(program: Program, slot: Slot, action: Action) -> Op | None:
    """The op of a communication action, or None when its peer is unknown or itself (a placement error)."""
    if not action.is_comm or not program.in_range(action):
        return None
    peer = program.peer_rank(action)
    if peer is None or peer == slot.rank:
        return None
    return Op(slot, action, peer)


def check_matching(pairing: Pairing) -> list[Violation]:
    """The first mismatch of each ordered rank pair, reported at the send."""
    found = []
    reported: set[tuple[int, int]] = set()
    for send, recv in pairing.matches:
        lane = (send.slot.rank, recv.slot.rank)
        if lane in reported or expected_partner(send.action) == recv.action:
            continue
        reported.add(lane)
        message = (f"{send.action} on rank {send.slot.rank} step {send.slot.index} meets {recv.action} on rank "
                   f"{recv.slot.rank} step {recv.slot.index} (NCCL pairs the k-th send with the k-th receive); "
                   f"it needs {expected_partner(send.action)}")
        found.append(violation_at("mismatch", message, send.slot))
    return found


def check_memory(program: Program, limit: float | None, weights: float) -> list[Violation]:
    """The first step on each rank whose additions take the held activations over ``limit``."""
    if limit is None:
        return []
    release = {ActionKind.B: 1.0, ActionKind.I: 1.0 - weights, ActionKind.W: weights}
    found = []
    for row in program.slots:
        held = 0.0
        for slot in row:
            actions = slot.step.actions if slot.step.is_compute else ()
            held += sum(1.0 for a in actions if a.kind is ActionKind.F)
            if held > limit + 1e-9:
                found.append(violation_at("memory", f"rank {slot.rank} holds {held:g} microbatches of "
                                          f"activations at {slot.text}, over the limit {limit:g}", slot))
                break
            held -= sum(release.get(a.kind, 0.0) for a in actions)
    return found
