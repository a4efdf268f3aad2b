"""lower: insert send/receive groups and REDUCE_GRAD into a compute-only schedule.

``lower(schedule)`` -> the schedule with communication: the compute order run globally in lockstep
rounds, and after each round one group per rank holding the sends of what it produced and the receives
of what others produced for it, every group listing its ops in one global order. So NCCL's FIFO
matching pairs them and a consistent compute order never deadlocks under rendezvous; an inconsistent
one (a wait cycle) is lowered lazily and deadlocks in ``verify`` on the cycle's own steps. REDUCE_GRAD
follows each stage's last B or W on its rank. Inserted steps carry the span of the compute step they
serve (``lower_with_origins`` also says which). The algorithm: ``docs/passes.md``.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from functools import partial
from typing import NamedTuple

from pipeforge.ir import COMPUTE_KINDS, Action, ActionKind, Schedule, Step, make_action, replace_programs
from pipeforge.semantics import GRADIENT_KINDS, LOCAL_KINDS, NEEDS, ActionKey, partner

Position = tuple[int, int]  # (rank, step index in the input program, idle slots counted)


class CarriedEdge(NamedTuple):
    """One cross-rank data edge of the input: ``send`` on the producer's rank, ``recv`` on the consumer's."""

    send: Action
    recv: Action
    producer: Position
    consumer: Position


@dataclass(frozen=True)
class Lowered:
    """A lowered schedule and, for each of its steps, the input step it serves."""

    schedule: Schedule
    origins: tuple[tuple[int, ...], ...]


def lower(schedule: Schedule) -> Schedule:
    """Compute-only in, lowered out (already-lowered input is returned unchanged)."""
    return lower_with_origins(schedule).schedule


def lower_with_origins(schedule: Schedule) -> Lowered:
    if schedule.is_lowered:
        origins = tuple(tuple(range(len(program))) for program in schedule.programs)
        return Lowered(schedule, origins)
    graph = DependencyGraph.of(schedule)
    rounds = run_rounds(schedule, graph)
    writer = ProgramWriter(schedule)
    emit_rounds(writer, schedule, graph, rounds)
    emit_remainder(writer, schedule, graph, rounds)
    return Lowered(replace_programs(schedule, writer.programs()), writer.origins())


# --- the dependency graph of the compute actions -------------------------------------------


@dataclass(frozen=True)
class DependencyGraph:
    """Where each compute action first occurs, what it needs, and the cross-rank edges."""

    position: dict[ActionKey, Position]
    needs: dict[Position, tuple[Position, ...]]  # step -> producer steps on other ranks it waits for
    transfers: tuple[CarriedEdge, ...]

    @staticmethod
    def of(schedule: Schedule) -> DependencyGraph:
        position = compute_positions(schedule)
        last = schedule.stages - 1
        waits: dict[Position, tuple[Position, ...]] = {}
        transfers: list[CarriedEdge] = []
        carried_once: set[ActionKey] = set()
        at = position.get
        edge = partial(tuple.__new__, CarriedEdge)
        shapes: dict[tuple, CarriedShape] = {}  # (stage, kind, chain) -> its carried needs' shape
        for action, here in position.items():  # in program order: rank, then step
            stage, kind, mb, chain = action
            shape = shapes.get((stage, kind, chain))
            if shape is None:
                shape = shapes[(stage, kind, chain)] = carried_shape(action, last)
            found: list[Position] = []
            for producers, (send_stage, send_kind), (recv_stage, recv_kind) in shape:
                for producer_stage, producer_kind in producers:
                    there = at((producer_stage, producer_kind, mb, chain))
                    # Only a cross-rank edge makes a rank wait: on one rank program order decides, and a
                    # producer written after its consumer is an order error, not a deadlock.
                    if there is None or there[0] == here[0]:
                        continue
                    found.append(there)
                    send = (send_stage, send_kind, mb, chain)
                    if send not in carried_once:  # once, even where B and I are both written (its receive
                        carried_once.add(send)    # is the partner of the send: the send alone names it)
                        transfers.append(edge((make_action(send), make_action((recv_stage, recv_kind, mb, chain)),
                                               there, here)))
            if found:  # (the actions of an overlap step share its position)
                waits[here] = (*waits[here], *found) if here in waits else tuple(found)
        return DependencyGraph(position, waits, tuple(transfers))


# The needs of a (stage, kind, chain) that a send/receive may carry: per need, its producers' (stage, kind)
# and the send's and the receive's (stage, kind); the microbatch and chain are the action's own.
CarriedShape = tuple[tuple[tuple[tuple[int, ActionKind], ...], tuple[int, ActionKind], tuple[int, ActionKind]], ...]


def carried_shape(action: ActionKey, last: int) -> CarriedShape:
    """``semantics.needs`` of ``action`` that a send carries (none for ``LOCAL_KINDS``: every need on its
    own stage, program order decides), asked once per (stage, kind, chain): every rule names actions of
    the action's own microbatch and chain (checked here)."""
    stage, kind, mb, chain = action
    if kind in LOCAL_KINDS:
        return ()
    shape = []
    for producers, send, recv in NEEDS[kind](stage, mb, chain, last):  # semantics.needs(action), unpacked
        if send is None:
            continue  # the producer is on the same stage: program order decides
        if any(key[2:] != (mb, chain) for key in (*producers, send, recv)) or partner(send) != recv:
            raise ValueError(f"internal error: {action!r} needs {producers!r} carried by {send!r} to {recv!r}, "
                             "of another microbatch or chain, or not a send and its receive")
        shape.append((tuple(key[:2] for key in producers), send[:2], recv[:2]))
    return tuple(shape)


def compute_positions(schedule: Schedule) -> dict[ActionKey, Position]:
    """Where each compute action first occurs on the rank that owns its stage. One written on
    another rank is a ``placement`` error: no communication (nor any wait) is derived from it."""
    position: dict[ActionKey, Position] = {}  # Actions, looked up by plain tuples equal to them
    owned = owned_stages(schedule)
    for rank, program in enumerate(schedule.programs):
        for index, step in enumerate(program):
            for a in step.actions:
                if a[1] in COMPUTE_KINDS and a not in position and a[0] in owned.get((rank, a[3]), ()):
                    position[a] = (rank, index)
    return position


def owned_stages(schedule: Schedule) -> dict[tuple[int, int], set[int]]:
    """(rank, chain) -> the stages the rank owns in the chain, in one pass over the placements (asked
    rank by rank, the placements were read once a rank: quadratic in the ranks, 2.7 s of 4000)."""
    owned: dict[tuple[int, int], set[int]] = defaultdict(set)
    for chain, placement in enumerate(schedule.placements):
        for stage, rank in enumerate(placement.stage_to_rank):
            owned[(rank, chain)].add(stage)
    return owned


# --- lockstep rounds -----------------------------------------------------------------------


@dataclass(frozen=True)
class Rounds:
    """The executed prefix: round of each executed step, and where each rank got stuck."""

    executed: tuple[list[int | None], ...]  # per rank, per step index: the round it ran in (None: it did not)
    order: tuple[tuple[tuple[int, int], ...], ...]  # per rank: (round, step index) in order
    stuck_at: tuple[int, ...]  # per rank: first step index not executed (len(program) if done)
    count: int


def run_rounds(schedule: Schedule, graph: DependencyGraph) -> Rounds:
    """Lockstep rounds, event-driven: a rank is looked at again only when it ran or a producer it
    waits for ran, so the work grows with the steps, not with ranks times rounds."""
    steps = [compute_indices(program) for program in schedule.programs]
    waits: list[dict[int, tuple[Position, ...]]] = [{} for _ in steps]  # per rank: step index -> its waits
    for (rank, index), producers in graph.needs.items():
        waits[rank][index] = producers
    needs = [[waits[rank].get(i, ()) for i in row] for rank, row in enumerate(steps)]
    done = [0] * len(steps)  # per rank: how many of its compute steps ran
    executed: tuple[list[int | None], ...] = tuple([None] * len(program) for program in schedule.programs)
    order: list[list[tuple[int, int]]] = [[] for _ in steps]
    waiting: dict[Position, list[int]] = defaultdict(list)  # producer -> ranks blocked on it
    candidates = [rank for rank, row in enumerate(steps) if row]
    round_no = 0
    while candidates:
        ran = []
        for rank in candidates:  # every executed entry is from an earlier round here
            for producer in needs[rank][done[rank]]:
                if executed[producer[0]][producer[1]] is None:
                    waiting[producer].append(rank)
                    break
            else:
                ran.append(rank)
        if not ran:
            break
        woken: set[int] = set()
        for rank in ran:
            n = done[rank]
            index = steps[rank][n]
            executed[rank][index] = round_no
            order[rank].append((round_no, index))
            done[rank] = n + 1
            if n + 1 < len(steps[rank]):
                woken.add(rank)
            if (rank, index) in waiting:
                woken.update(waiting.pop((rank, index)))
        candidates = sorted(woken)
        round_no += 1
    stuck_at = tuple(row[n] if n < len(row) else len(program)
                     for row, n, program in zip(steps, done, schedule.programs))
    return Rounds(executed, tuple(map(tuple, order)), stuck_at, round_no)


def compute_indices(program: tuple[Step, ...]) -> list[int]:
    """The indices of a program's compute steps."""
    return [i for i, step in enumerate(program) if step.actions and step.actions[0][1] in COMPUTE_KINDS]


def next_compute(program: tuple[Step, ...], start: int) -> int:
    index = start
    while index < len(program) and not program[index].is_compute:
        index += 1
    return index


# --- writing the lowered programs ----------------------------------------------------------


class ProgramWriter:
    """Accumulates each rank's lowered steps with the input step each one serves."""

    def __init__(self, schedule: Schedule):
        self.schedule = schedule
        self.steps: list[list[Step]] = [[] for _ in schedule.programs]
        self.served: list[list[int]] = [[] for _ in schedule.programs]
        self.reduce_after = last_backwards(schedule)

    def copy(self, rank: int, index: int) -> None:
        self.steps[rank].append(self.schedule.programs[rank][index])
        self.served[rank].append(index)

    def group(self, rank: int, keys: list[Action], serves: int) -> None:
        if not keys:
            return
        span = self.schedule.programs[rank][serves].span
        self.steps[rank].append(Step(tuple(keys), span=span))
        self.served[rank].append(serves)

    def reduce_grads(self, rank: int, index: int) -> None:
        stages = self.reduce_after.get((rank, index))
        if not stages:
            return
        span = self.schedule.programs[rank][index].span
        for stage in stages:
            self.steps[rank].append(Step((Action(stage, ActionKind.REDUCE_GRAD),), span=span))
            self.served[rank].append(index)

    def passthrough(self, rank: int, start: int, stop: int) -> None:
        """Copy the non-compute, non-idle steps (a written REDUCE_GRAD, UNSHARD, ...) in [start, stop)."""
        program = self.schedule.programs[rank]
        for index in range(start, stop):
            if not program[index].is_idle and not program[index].is_compute:
                self.copy(rank, index)

    def programs(self) -> tuple[tuple[Step, ...], ...]:
        return tuple(map(tuple, self.steps))

    def origins(self) -> tuple[tuple[int, ...], ...]:
        return tuple(map(tuple, self.served))


def last_backwards(schedule: Schedule) -> dict[Position, list[int]]:
    """For each step, the stages whose last B/W on its rank it holds (REDUCE_GRAD goes after it)."""
    last: dict[tuple[int, int], int] = {}
    written: set[tuple[int, int]] = set()
    reduce_grad = ActionKind.REDUCE_GRAD
    for rank, program in enumerate(schedule.programs):
        for index, step in enumerate(program):
            for action in step.actions:
                kind = action[1]
                if kind in GRADIENT_KINDS:
                    last[(rank, action[0])] = index
                elif kind is reduce_grad:
                    written.add((rank, action[0]))
    after: dict[Position, list[int]] = defaultdict(list)
    for (rank, stage), index in sorted(last.items()):
        if (rank, stage) not in written:
            after[(rank, index)].append(stage)
    return after


def emit_rounds(writer: ProgramWriter, schedule: Schedule, graph: DependencyGraph, rounds: Rounds) -> None:
    groups = round_groups(graph, rounds, len(schedule.programs))
    reduce_after = writer.reduce_after
    for rank, program in enumerate(schedule.programs):
        steps, served, posted = writer.steps[rank], writer.served[rank], groups[rank]
        done = 0
        by_round = dict(rounds.order[rank])
        for round_no in sorted(posted.keys() | by_round.keys()):
            index = by_round.get(round_no)
            if index is not None:
                if index > done:
                    writer.passthrough(rank, done, index)
                steps.append(program[index])
                served.append(index)
                done = index + 1
            keys = posted.get(round_no)
            if keys:
                serves = index if index is not None else min(next_compute(program, done), len(program) - 1)
                steps.append(Step(tuple(keys), False, program[serves].span))
                served.append(serves)
            if index is not None and (rank, index) in reduce_after:  # (a set a rank from all ranks: quadratic)
                writer.reduce_grads(rank, index)
        if rounds.stuck_at[rank] >= len(program):
            writer.passthrough(rank, done, len(program))


def round_groups(graph: DependencyGraph, rounds: Rounds, ranks: int) -> list[dict[int, list[Action]]]:
    """Per rank: round -> the group posted after that round.

    Every group lists its sends and receives in one global order (that of the
    transfers), so on each ordered rank pair both ends list one round's transfers
    alike (FIFO-consistent), and even split into groups of one (a torch CSV has
    no groups) the ops meet pair by pair in that global order without deadlock.
    """
    groups: list[dict[int, list[Action]]] = [defaultdict(list) for _ in range(ranks)]
    executed = rounds.executed
    for send, recv, producer, consumer in graph.transfers:
        round_no = executed[producer[0]][producer[1]]
        if round_no is not None:
            groups[producer[0]][round_no].append(send)
            groups[consumer[0]][round_no].append(recv)
    return groups


# --- the stuck remainder -------------------------------------------------------------------


def emit_remainder(writer: ProgramWriter, schedule: Schedule, graph: DependencyGraph, rounds: Rounds) -> None:
    """Lower what the rounds could not run: receives just in time, sends in FIFO order."""
    if all(stuck >= len(program) for stuck, program in zip(rounds.stuck_at, schedule.programs, strict=True)):
        return  # every rank ran to its end: every producer ran, nothing is pending
    executed = rounds.executed
    pending = [t for t in graph.transfers if executed[t.producer[0]][t.producer[1]] is None]
    recv_before: dict[Position, list[CarriedEdge]] = defaultdict(list)
    send_after: dict[Position, list[tuple[int, int, CarriedEdge]]] = defaultdict(list)
    for (src, dst), lane in lanes(pending).items():
        posted_after = -1
        for seq, transfer in enumerate(lane):
            recv_before[transfer.consumer].append(transfer)
            posted_after = max(posted_after, transfer.producer[1])
            send_after[(src, posted_after)].append((dst, seq, transfer))
    for rank, program in enumerate(schedule.programs):
        if rounds.stuck_at[rank] >= len(program):
            continue
        resume = rounds.order[rank][-1][1] + 1 if rounds.order[rank] else 0
        for index in range(resume, len(program)):
            if program[index].is_idle:
                continue
            incoming = sorted(recv_before.get((rank, index), []), key=lambda t: (t.producer[0], t.send))
            writer.group(rank, [t.recv for t in incoming], index)
            writer.copy(rank, index)
            outgoing = sorted(send_after.get((rank, index), []), key=lambda item: item[:2])
            writer.group(rank, [t.send for _, _, t in outgoing], index)
            writer.reduce_grads(rank, index)


def lanes(transfers: list[CarriedEdge]) -> dict[tuple[int, int], list[CarriedEdge]]:
    """Carried edges per ordered rank pair, in the order the consumer needs them."""
    by_pair: dict[tuple[int, int], list[CarriedEdge]] = defaultdict(list)
    for transfer in transfers:
        by_pair[(transfer.producer[0], transfer.consumer[0])].append(transfer)
    return {pair: sorted(items, key=lambda t: (t.consumer[1], t.send)) for pair, items in by_pair.items()}
