"""NCCL point-to-point matching (tags ignored): the k-th send from a to b meets the k-th receive on b from a.

``early_receives_pair_alike``: the same pairing when each rank posts receives ahead of the program as
``semantics.early_receives`` lets the runtime (docs/semantics.md, "Receives posted early").
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property, partial
from typing import NamedTuple

from pipeforge.ir import ActionKind, Schedule
from pipeforge.semantics import PEER_OFFSET, SENDS, ActionKey, early_receives, peer_stage
from pipeforge.semantics import partner as partner_key
from pipeforge.verifier.program import Program, Slot, text_of, violation_at
from pipeforge.verifier.report import Violation


class Op(NamedTuple):
    """One send or receive at a slot, with the rank at its other end."""

    slot: Slot
    key: ActionKey
    peer: int | None  # None: no rank owns the peer stage
    is_send: bool
    at: tuple[int, int]  # its group slot as (rank, slot number): the timing model's name for it

    @property
    def text(self) -> str:
        return text_of(self.key)


@dataclass(frozen=True)
class Pairing:
    """The k-th send from a to b meets the k-th receive on b from a (a may be b: a placement
    error, matched all the same)."""

    matches: tuple[tuple[Op, Op], ...]  # (send, recv)
    unmatched: tuple[Op, ...]
    ops: dict[tuple[int, int], list[Op]]  # group slot -> its ops in written order

    @cached_property
    def partner(self) -> dict[int, Op]:
        """id(op) -> the op it meets; made on first use (the rendezvous pass of a valid schedule never asks)."""
        partner = {}
        for send, recv in self.matches:
            partner[id(send)] = recv
            partner[id(recv)] = send
        return partner

    def ops_of(self, where: tuple[int, int]) -> list[tuple[Op, Op | None]]:
        """(op, its partner or None) for each op of the group slot ``where``."""
        return [(op, self.partner.get(id(op))) for op in self.ops.get(where, ())]


def pair_ops(program: Program) -> Pairing:
    lanes: dict[tuple[int, int, bool], list[Op]] = defaultdict(list)
    ops: dict[tuple[int, int], list[Op]] = {}
    unmatched: list[Op] = []
    new_op = partial(tuple.__new__, Op)
    peers = peer_ranks(program)
    for rank, row in enumerate(program.slots):
        ends: dict[tuple[int, ActionKind, int], tuple[int | None, bool, list[Op]]] = {}  # per (stage, kind, chain)
        for slot in row:
            if not slot.group:
                continue
            at = (rank, slot.number)
            mine = ops[at] = []
            for key in slot.acts:
                end = ends.get((key[0], key[1], key[3]))
                if end is None:
                    end = ends[(key[0], key[1], key[3])] = lane_end(peers, key, rank, lanes, unmatched)
                peer, is_send, lane = end
                op = new_op((slot, key, peer, is_send, at))
                mine.append(op)
                lane.append(op)
    matches: list[tuple[Op, Op]] = []
    for src, dst, is_send in sorted(lanes):
        if not is_send:
            if (src, dst, True) not in lanes:
                unmatched.extend(lanes[(src, dst, False)])
            continue
        out, into = lanes[(src, dst, True)], lanes.get((src, dst, False), [])
        matches.extend(zip(out, into))
        longer = out if len(out) > len(into) else into
        unmatched.extend(longer[min(len(out), len(into)):])
    return Pairing(tuple(matches), tuple(unmatched), ops)


def lane_end(peers: dict[tuple[int, ActionKind, int], int], key: ActionKey, rank: int,
             lanes: dict[tuple[int, int, bool], list[Op]], unmatched: list[Op]) -> tuple[int | None, bool, list[Op]]:
    """(peer rank, is a send, the list its ops join) of the communication actions of ``key``'s stage, kind
    and chain on ``rank``: the lane of sends from this rank to the peer or of receives on it from the peer,
    or the unmatched ops when no rank owns the peer stage. Asked once per (stage, kind, chain) of a rank:
    neither depends on the microbatch."""
    stage, kind, _, chain = key
    peer, is_send = peers.get((stage, kind, chain)), kind in SENDS
    if peer is None:
        return None, is_send, unmatched
    return peer, is_send, lanes[(rank, peer, True) if is_send else (peer, rank, False)]


def peer_ranks(program: Program) -> dict[tuple[int, ActionKind, int], int]:
    """(stage, kind, chain) of a communication action -> the rank owning its peer stage. Absent when
    its stage, peer stage or chain does not exist (a placement error): nothing can ever meet such an
    op. (A microbatch out of range is a placement error too, but the op is matched like any other.)
    A table, looked up once per op (a call per op cost a third of the pairing)."""
    table = {}
    for chain, owners in enumerate(program.owners):
        for kind, offset in PEER_OFFSET.items():
            for stage in range(max(0, -offset), min(len(owners), len(owners) - offset)):
                table[(stage, kind, chain)] = owners[stage + offset]
    return table


def check_matching(pairing: Pairing) -> list[Violation]:
    """The first mismatch of each ordered rank pair, reported at the send."""
    found = []
    reported: set[tuple[int, int]] = set()
    for send, recv in pairing.matches:
        lane = (send.slot.rank, recv.slot.rank)
        if lane in reported or partner_key(send.key) == recv.key:
            continue
        reported.add(lane)
        there = f" ({recv.slot.span})" if recv.slot.span else ""
        message = (f"{send.text} on rank {send.slot.rank} step {send.slot.index} meets {recv.text} on rank "
                   f"{recv.slot.rank} step {recv.slot.index}{there} (NCCL pairs the k-th send with the k-th "
                   f"receive); it needs {text_of(partner_key(send.key))}")
        found.append(violation_at("mismatch", message, send.slot))
    return found


Chooser = Callable[[list[ActionKey], Callable[[ActionKey], int | None], Callable[[ActionKey], bool]], list[ActionKey]]


def early_receives_pair_alike(schedule: Schedule, ready: Callable[[ActionKey], bool] = lambda key: True,
                              choose: Chooser = early_receives) -> bool:
    """Whether every rank of ``schedule`` (lowered) receives from each peer in the same order when it posts
    the receives ``choose`` picks (``ready``: whose buffers are known) at the start of its program, the
    others where they stand: then the k-th send still meets the k-th receive, and the pairing is the
    schedule's own."""
    def peer_of(key: ActionKey) -> int | None:
        stage = peer_stage(key)
        return schedule.rank_of(stage, key[3]) if 0 <= stage < schedule.stages else None

    for program in schedule.programs:
        receives: list[ActionKey] = [action for step in program if step.is_group for action in step.actions
                    if action.kind in PEER_OFFSET and action.kind not in SENDS]
        early = choose(receives, peer_of, ready)
        taken = {id(key) for key in early}
        posted: list[ActionKey] = [*early, *(key for key in receives if id(key) not in taken)]
        if _per_peer(receives, peer_of) != _per_peer(posted, peer_of):
            return False
    return True


def _per_peer(receives: list[ActionKey], peer_of: Callable[[ActionKey], int | None]) -> dict:
    lanes: dict[int | None, list[ActionKey]] = defaultdict(list)
    for key in receives:
        lanes[peer_of(key)].append(key)
    return lanes
