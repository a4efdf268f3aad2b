"""An independent oracle for ``verify``: docs/semantics.md, simulated step by step.

Written apart from ``pipeforge.verify`` and ``pipeforge.passes`` (it imports
neither) so that the two can be checked against each other. It reports which
kinds of violation a schedule has, not where.

A schedule with written communication is checked as written: structure,
static order, NCCL FIFO matching, then execution under ``rendezvous`` or
``buffered``. A compute-only schedule is checked the way ``verify(lower(s))``
sees it when ``lower`` is right: structure and same-rank order on the compute
actions, and ``deadlock`` exactly when no global execution respects program
order and the cross-rank data dependencies.

Where the spec leaves room, the reading taken is listed in ``NOTES`` below.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass

from pipeforge.ir import Action, ActionKind, MemorySpec, Schedule, Step

K = ActionKind
# docs/semantics.md: a forward send goes up a stage and its receive comes from below; gradients the other way
PEER = {K.SEND_F: 1, K.RECV_F: -1, K.SEND_B: -1, K.RECV_B: 1}


def peer_of(a: Action) -> int:
    """The stage at the other end of communication action ``a``."""
    return a.stage + PEER[a.kind]


NOTES = """
- An unmatched communication op (its pair has fewer partners) blocks forever:
  under rendezvous its group never fires; under buffered an unmatched receive
  never completes (an unmatched send completes once posted); under nccl no
  unmatched op completes.
- A communication action whose stage or peer stage is out of range, or whose
  chain is undeclared, takes part in no matching (it is unmatched).
- Matching also pairs a rank with itself (a send and a receive whose peer is
  the rank they are on; already a placement violation).
- Memory: an overlap step's additions apply first, so its peak is checked
  before its releases.
- Same rank means the rank the action is written on. An action on a rank that
  does not own its stage is `placement` only: it neither waits nor satisfies a
  need, and nothing is derived from it (no order, and in a compute-only
  schedule no communication, so no mismatch or deadlock).
- A need whose action is nowhere on the rank is not `order`: the action is
  missing (or misplaced), which is reported as that.
- REDUCE_GRAD, UNSHARD and RESHARD act on their stage on the rank they are on,
  whatever their chain: placement asks whether the rank holds the stage in any
  chain; REDUCE_GRAD's duplicates are counted per (rank, stage); the UNSHARD /
  RESHARD alternation per (rank, stage), over every compute action of the
  stage on that rank. Out-of-range ones take no part in these rules (but
  REDUCE_GRAD's order is checked whatever its range).
- Memory: UNSHARD adds ``unsharded`` like F adds 1, RESHARD releases it like B.
- Recompute and offload. R(s,m) needs F(s,m) earlier; OFFLOAD(s,m) needs
  F(s,m); RELOAD(s,m) needs OFFLOAD(s,m); a B or I of (s,m) needs R(s,m) and
  RELOAD(s,m) earlier when the rank has them (absent, they are not needed).
  R beside OFFLOAD or RELOAD of one (s,m) is a duplicate; OFFLOAD without
  RELOAD, or RELOAD without OFFLOAD, is missing. Memory: the F of an (s,m) the
  schedule recomputes (an R anywhere) adds the checkpoint, R the rest of the
  activation; OFFLOAD releases the activation, RELOAD adds it back.
- The copy lane, in time (``copy_lane_timing``, which reads a timeline rather
  than a verdict): OFFLOAD and RELOAD are issued when the compute before them
  has ended and run one at a time in program order; a step that adds memory
  waits for the end of an earlier OFFLOAD only so far as, counting the
  program-order amount but each OFFLOAD's release only from its end, it would
  pass the limit: it waits for the first j OFFLOADs, j the least that brings it
  within (all of them when none does); with no limit it never waits. Then what
  a rank holds over time (additions from their start, releases from their
  end, releases first at one time) never passes a limit the program keeps.
"""


@dataclass(frozen=True)
class OracleResult:
    valid: bool
    kinds: frozenset[str]
    details: tuple[str, ...] = ()


def oracle(schedule: Schedule, semantics: str = "rendezvous", memory: bool = True,
           memory_limit: float | None = None) -> OracleResult:
    """What docs/semantics.md says of ``schedule``; ``memory_limit`` overrides the schedule's own limit."""
    if semantics not in ("rendezvous", "buffered", "nccl"):
        raise ValueError(f"semantics {semantics!r}")
    world = World(schedule)
    found: list[tuple[str, str]] = []
    found += world.placement()
    found += world.compute_structure()
    if world.lowered:
        found += world.comm_structure()
    found += world.order()
    found += world.stage_only()
    if world.lowered:
        matches, mismatches = world.matching()
        found += mismatches
        found += world.execute(matches, semantics)
    else:
        found += world.execute_compute()
    spec = schedule.memory or MemorySpec()
    limit = memory_limit if memory_limit is not None else spec.limit
    if memory and limit is not None:
        found += world.memory(limit, spec.weights, spec.unsharded, min(spec.checkpoint, 1.0))
    kinds = frozenset(kind for kind, _ in found)
    return OracleResult(not found, kinds, tuple(f"{kind}: {text}" for kind, text in found))


def key(action: Action) -> tuple:
    return (action.stage, action.kind, action.microbatch, action.chain)


class World:
    """The schedule without idle steps, and the questions the checks ask of it."""

    def __init__(self, schedule: Schedule):
        self.s = schedule
        self.programs: list[list[tuple[int, Step]]] = [
            [(i, step) for i, step in enumerate(program) if not step.is_idle] for program in schedule.programs
        ]
        self.lowered = schedule.is_lowered

    # -- basic questions

    def owner(self, stage: int, chain: int) -> int | None:
        if not 0 <= chain < self.s.chains or not 0 <= stage < self.s.stages:
            return None
        return self.s.rank_of(stage, chain)

    def in_range(self, a: Action) -> bool:
        if not 0 <= a.chain < self.s.chains or not 0 <= a.stage < self.s.stages:
            return False
        if a.kind.has_microbatch and not 0 <= (a.microbatch if a.microbatch is not None else -1) < self.s.microbatches:
            return False
        return not a.is_comm or 0 <= peer_of(a) < self.s.stages

    def actions(self):
        for rank, program in enumerate(self.programs):
            for index, step in program:
                for action in step.actions:
                    yield rank, index, action

    # -- structure

    def placement(self) -> list[tuple[str, str]]:
        found = []
        for rank, index, a in self.actions():
            problem = self.placement_problem(rank, a)
            if problem:
                found.append(("placement", f"rank {rank} step {index} {a}: {problem}"))
        found += self.chain_placement()
        return found

    def placement_problem(self, rank: int, a: Action) -> str | None:
        if not 0 <= a.chain < self.s.chains:
            return "undeclared chain"
        if not 0 <= a.stage < self.s.stages:
            return "stage out of range"
        if a.kind.has_microbatch and not 0 <= a.microbatch < self.s.microbatches:
            return "microbatch out of range"
        if (a.is_compute or a.is_comm) and self.owner(a.stage, a.chain) != rank:
            return "rank does not own the stage"
        if not a.kind.has_microbatch and rank not in {self.owner(a.stage, c) for c in range(self.s.chains)}:
            return "rank holds no replica of the stage"
        if a.is_comm:
            peer = peer_of(a)
            if not 0 <= peer < self.s.stages:
                return "peer stage out of range"
            if self.owner(peer, a.chain) == rank:
                return "communication between stages on one rank"
        return None

    def chain_placement(self) -> list[tuple[str, str]]:
        if self.s.chains == 1:
            return []
        chain_of: dict[int, int] = {}
        for _, _, a in self.actions():
            if a.kind is K.F and a.stage == 0:
                chain_of.setdefault(a.microbatch, a.chain)
        return [("placement", f"{a} is not on chain {chain_of[a.microbatch]} of its microbatch")
                for _, _, a in self.actions()
                if a.microbatch in chain_of and a.chain != chain_of[a.microbatch]]

    def compute_structure(self) -> list[tuple[str, str]]:
        computes = [a for _, _, a in self.actions() if a.is_compute and self.in_range(a)]
        counts = Counter(key(a) for a in computes)
        found = [("duplicate", f"{k} appears {n} times") for k, n in counts.items() if n > 1]
        kinds_of: dict[tuple, set] = defaultdict(set)
        for a in computes:
            kinds_of[(a.stage, a.microbatch, a.chain)].add(a.kind)
        found += [("duplicate", f"B and I/W for {k}") for k, ks in kinds_of.items() if K.B in ks and ks & {K.I, K.W}]
        found += [("duplicate", f"R and OFFLOAD/RELOAD for {k}") for k, ks in kinds_of.items()
                  if K.R in ks and ks & {K.OFFLOAD, K.RELOAD}]
        unchained: dict[tuple, set] = defaultdict(set)
        for (stage, mb, _), ks in kinds_of.items():
            unchained[(stage, mb)] |= ks
        for stage in range(self.s.stages):
            for mb in range(self.s.microbatches):
                ks = unchained[(stage, mb)]
                if K.F not in ks:
                    found.append(("missing", f"F({stage},{mb})"))
                if K.B not in ks and not {K.I, K.W} <= ks:
                    found.append(("missing", f"backward of ({stage},{mb})"))
                if K.W in ks and K.I not in ks:
                    found.append(("missing", f"I({stage},{mb}) for its W"))
                if (K.OFFLOAD in ks) != (K.RELOAD in ks):
                    found.append(("missing", f"OFFLOAD and RELOAD of ({stage},{mb}) go together"))
        return found

    def needed_comms(self) -> set[tuple[Action, int]]:
        needed = set()
        computes = {key(a) for _, _, a in self.actions() if a.is_compute and self.in_range(a)}
        for stage, kind, mb, chain in computes:
            here = self.owner(stage, chain)
            if kind is K.F and stage + 1 < self.s.stages and self.owner(stage + 1, chain) != here:
                needed.add((Action(stage, K.SEND_F, mb, chain), here))
                needed.add((Action(stage + 1, K.RECV_F, mb, chain), self.owner(stage + 1, chain)))
            if kind in (K.B, K.I) and stage > 0 and self.owner(stage - 1, chain) != here:
                needed.add((Action(stage, K.SEND_B, mb, chain), here))
                needed.add((Action(stage - 1, K.RECV_B, mb, chain), self.owner(stage - 1, chain)))
        return needed

    def comm_structure(self) -> list[tuple[str, str]]:
        needed = self.needed_comms()
        needed_actions = {a for a, _ in needed}
        present = [(a, rank) for rank, _, a in self.actions() if a.is_comm and self.in_range(a)]
        counts = Counter(a for a, _ in present)
        found = [("duplicate", f"{a} appears {n} times") for a, n in counts.items() if n > 1]
        found += [("duplicate", f"{a} is not needed") for a in counts if a not in needed_actions]
        found += [("missing", f"{a} on rank {rank}") for a, rank in needed if (a, rank) not in set(present)]
        return found

    # -- static order

    def placed(self, rank: int, a: Action) -> bool:
        """In range, and (for compute and communication) on the rank that owns its stage."""
        return self.in_range(a) and (not (a.is_compute or a.is_comm) or self.owner(a.stage, a.chain) == rank)

    def order(self) -> list[tuple[str, str]]:
        found = []
        for rank, program in enumerate(self.programs):
            seen: set[tuple] = set()
            on_rank = {key(a) for _, step in program for a in step.actions}
            for index, step in program:
                for a in step.actions:
                    if self.placed(rank, a) and not self.satisfied(rank, a, seen, on_rank):
                        found.append(("order", f"rank {rank} step {index} {a}"))
                seen |= {key(a) for a in step.actions}
            found += self.reduce_grad_order(rank, program)
        return found

    def satisfied(self, rank: int, a: Action, seen: set[tuple], on_rank: set[tuple]) -> bool:
        """Each need met earlier on the rank, or absent from the rank altogether (then the needed
        action is missing or misplaced, and reported as that only)."""
        return all(any(option in seen for option in need) or not any(option in on_rank for option in need)
                   for need in self.static_needs(rank, a))

    def static_needs(self, rank: int, a: Action) -> list[tuple[tuple, ...]]:
        """Each need is a tuple of alternatives (keys of actions) one of which must be earlier."""
        s, m, c = a.stage, a.microbatch, a.chain
        if a.kind is K.F and s > 0:
            if self.owner(s - 1, c) == rank:
                return [((s - 1, K.F, m, c),)]
            return [((s, K.RECV_F, m, c),)] if self.lowered else []
        if a.kind in (K.R, K.OFFLOAD):
            return [((s, K.F, m, c),)]
        if a.kind is K.RELOAD:
            return [((s, K.OFFLOAD, m, c),)]
        if a.kind in (K.B, K.I):
            needs = [((s, K.F, m, c),), ((s, K.R, m, c),), ((s, K.RELOAD, m, c),)]  # the last two when there
            if s < self.s.stages - 1:
                if self.owner(s + 1, c) == rank:
                    needs.append(((s + 1, K.B, m, c), (s + 1, K.I, m, c)))
                elif self.lowered:
                    needs.append(((s, K.RECV_B, m, c),))
            return needs
        if a.kind is K.W:
            return [((s, K.I, m, c),)]
        if a.kind is K.SEND_F:
            return [((s, K.F, m, c),)]
        if a.kind is K.SEND_B:
            return [((s, K.B, m, c), (s, K.I, m, c))]
        return []

    def reduce_grad_order(self, rank: int, program) -> list[tuple[str, str]]:
        found = []
        for position, (index, step) in enumerate(program):
            for a in step.actions:
                if a.kind is not K.REDUCE_GRAD:
                    continue
                later = [b for _, st in program[position:] for b in st.actions
                         if b.kind in (K.B, K.W) and b.stage == a.stage]
                if later:
                    found.append(("order", f"rank {rank} step {index} {a} before {later[0]}"))
        return found

    # -- the stage-only actions: REDUCE_GRAD once per rank and stage; UNSHARD/RESHARD windows

    def stage_only(self) -> list[tuple[str, str]]:
        found = []
        for rank, program in enumerate(self.programs):
            actions = [(index, a) for index, step in program for a in step.actions if self.in_range(a)]
            reduced = Counter(a.stage for _, a in actions if a.kind is K.REDUCE_GRAD)
            found += [("duplicate", f"rank {rank}: {n} REDUCE_GRAD of stage {s}") for s, n in reduced.items() if n > 1]
            for stage in sorted({a.stage for _, a in actions if a.kind in (K.UNSHARD, K.RESHARD)}):
                found += self.shard_window(rank, stage, [(i, a) for i, a in actions if a.stage == stage])
        return found

    def shard_window(self, rank: int, stage: int, actions) -> list[tuple[str, str]]:
        found, gathered = [], False
        for index, a in actions:
            if a.kind is K.UNSHARD:
                if gathered:
                    found.append(("order", f"rank {rank} step {index}: {a} while unsharded"))
                gathered = True
            elif a.kind is K.RESHARD:
                if not gathered:
                    found.append(("order", f"rank {rank} step {index}: {a} while sharded"))
                gathered = False
            elif a.is_compute and not gathered:
                found.append(("order", f"rank {rank} step {index}: {a} on sharded parameters"))
        if gathered:
            found.append(("missing", f"rank {rank}: stage {stage} left unsharded"))
        return found

    # -- matching (NCCL: per ordered pair of ranks, k-th send meets k-th receive)

    def peer_rank(self, a: Action) -> int | None:
        if not 0 <= a.chain < self.s.chains or not 0 <= a.stage < self.s.stages:
            return None
        peer = peer_of(a)
        return self.owner(peer, a.chain) if 0 <= peer < self.s.stages else None

    def matching(self):
        """(partner of each op, mismatch findings); an op is (rank, position, slot)."""
        sends, recvs = defaultdict(list), defaultdict(list)
        for rank, program in enumerate(self.programs):
            for position, (_, step) in enumerate(program):
                for slot, a in enumerate(step.actions):
                    peer = self.peer_rank(a) if a.is_comm else None
                    if peer is None:
                        continue
                    if a.kind in (K.SEND_F, K.SEND_B):
                        sends[(rank, peer)].append(((rank, position, slot), a))
                    else:
                        recvs[(peer, rank)].append(((rank, position, slot), a))
        partner, found = {}, []
        for pair in set(sends) | set(recvs):
            first = True
            for (send_op, send), (recv_op, recv) in zip(sends[pair], recvs[pair]):
                partner[send_op], partner[recv_op] = recv_op, send_op
                if recv != expected_receive(send) and first:
                    found.append(("mismatch", f"ranks {pair}: {send} meets {recv}"))
                    first = False
        return partner, found

    # -- execution

    def execute(self, partner: dict, semantics: str) -> list[tuple[str, str]]:
        pc = [0] * len(self.programs)
        fire = self.rendezvous_step if semantics == "rendezvous" else self.buffered_step
        components = self.components(partner) if semantics == "rendezvous" else semantics
        progress = True
        while progress:
            progress = self.run_compute(pc)
            progress = fire(pc, partner, components) or progress
        return self.stuck(pc)

    def stuck(self, pc: list[int]) -> list[tuple[str, str]]:
        return [("deadlock", f"rank {r} stuck at {self.programs[r][pc[r]][1]}")
                for r in range(len(pc)) if pc[r] < len(self.programs[r])]

    def current(self, pc: list[int], rank: int) -> Step | None:
        return self.programs[rank][pc[rank]][1] if pc[rank] < len(self.programs[rank]) else None

    def run_compute(self, pc: list[int]) -> bool:
        moved = False
        for rank in range(len(pc)):
            while (step := self.current(pc, rank)) is not None and not step.is_group:
                pc[rank] += 1
                moved = True
        return moved

    def components(self, partner: dict) -> dict[tuple[int, int], frozenset]:
        parent: dict = {}

        def find(x):
            while parent.setdefault(x, x) != x:
                parent[x] = parent[parent[x]]
                x = parent[x]
            return x

        for op, other in partner.items():
            parent[find(op[:2])] = find(other[:2])
        groups = [(r, p) for r, program in enumerate(self.programs) for p, (_, st) in enumerate(program) if st.is_group]
        members = defaultdict(set)
        for group in groups:
            members[find(group)].add(group)
        return {group: frozenset(members[find(group)]) for group in groups}

    def fully_matched(self, group: tuple[int, int], partner: dict) -> bool:
        rank, position = group
        step = self.programs[rank][position][1]
        return all((rank, position, slot) in partner for slot in range(len(step.actions)))

    def rendezvous_step(self, pc, partner, components) -> bool:
        moved = False
        for rank in range(len(pc)):
            if self.current(pc, rank) is None or (rank, pc[rank]) not in components:
                continue
            component = components[(rank, pc[rank])]
            ready = all(pc[r] == p and self.fully_matched((r, p), partner) for r, p in component)
            if ready:
                for r, _ in component:
                    pc[r] += 1
                moved = True
        return moved

    def buffered_step(self, pc, partner, semantics) -> bool:
        """buffered: each receive waits for its send to be posted; nccl: every op waits for its partner."""
        moved = False
        for rank in range(len(pc)):
            step = self.current(pc, rank)
            if step is None or not step.is_group:
                continue
            if all(self.op_ready(rank, pc, slot, a, partner, semantics) for slot, a in enumerate(step.actions)):
                pc[rank] += 1
                moved = True
        return moved

    def op_ready(self, rank, pc, slot, a: Action, partner, semantics) -> bool:
        if semantics == "buffered" and a.kind not in (K.RECV_F, K.RECV_B):
            return True
        other = partner.get((rank, pc[rank], slot))
        return other is not None and pc[other[0]] >= other[1]

    # -- compute-only: is there a global execution respecting the cross-rank dependencies?

    def execute_compute(self) -> list[tuple[str, str]]:
        """Only actions on their stage's rank produce or wait: a misplaced one is placement only."""
        exists = {key(a) for r, _, a in self.actions() if a.is_compute and self.placed(r, a)}
        done: set[tuple] = set()
        pc = [0] * len(self.programs)
        progress = True
        while progress:
            progress = False
            for rank in range(len(pc)):
                while (step := self.current(pc, rank)) is not None and self.may_run(rank, step, exists, done):
                    done |= {key(a) for a in step.actions if self.placed(rank, a)}
                    pc[rank] += 1
                    progress = True
        return self.stuck(pc)

    def may_run(self, rank: int, step: Step, exists: set, done: set) -> bool:
        for a in step.actions:
            for need in self.cross_rank_needs(rank, a):
                present = [option for option in need if option in exists]
                if present and not any(option in done for option in present):
                    return False
        return True

    def cross_rank_needs(self, rank: int, a: Action) -> list[tuple[tuple, ...]]:
        if not a.is_compute or not self.placed(rank, a):
            return []
        s, m, c = a.stage, a.microbatch, a.chain
        if a.kind is K.F and s > 0 and self.owner(s - 1, c) != rank:
            return [((s - 1, K.F, m, c),)]
        if a.kind in (K.B, K.I) and s < self.s.stages - 1 and self.owner(s + 1, c) != rank:
            return [((s + 1, K.B, m, c), (s + 1, K.I, m, c))]
        return []

    # -- memory

    def memory(self, limit: float, weights: float, unsharded: float = 0.0,
               checkpoint: float = 0.0) -> list[tuple[str, str]]:
        release = {K.I: 1 - weights, K.W: weights, K.B: 1.0, K.RESHARD: unsharded, K.OFFLOAD: 1.0}
        add = {K.F: 1.0, K.UNSHARD: unsharded, K.RELOAD: 1.0, K.R: 1.0 - checkpoint}
        rebuilt = {(a.stage, a.microbatch, a.chain) for _, _, a in self.actions() if a.kind is K.R}

        def added(a: Action) -> float:
            if a.kind is K.F and (a.stage, a.microbatch, a.chain) in rebuilt:
                return checkpoint
            return add.get(a.kind, 0.0)

        found = []
        for rank, program in enumerate(self.programs):
            held = 0.0
            for index, step in program:
                held += sum(added(a) for a in step.actions)
                if held > limit + 1e-9:
                    found.append(("memory", f"rank {rank} step {index} holds {held} > {limit}"))
                    break
                held -= sum(release.get(a.kind, 0.0) for a in step.actions)
        return found


def copy_lane_timing(schedule: Schedule, events, comm: float, weights: float, checkpoint: float,
                     limit: float | None) -> list[str]:
    """What is wrong with ``events`` (a timeline of the compute-only ``schedule``: each with ``rank``,
    ``step``, ``lane``, ``start``, ``end``, ``action_spans()``) by the copy lane rule of ``NOTES``: each
    step must start exactly when the last of what it waits for ends, and a kept limit must hold in time."""
    ends = {key(a): (e.rank, end) for e in events for a, _, end in e.action_spans()}
    rebuilt = {(a.stage, a.microbatch, a.chain) for _, _, a in schedule.actions() if a.kind is K.R}
    release = {K.I: 1 - weights, K.W: weights, K.B: 1.0, K.OFFLOAD: 1.0}

    def added(a: Action) -> float:
        if a.kind is K.F:
            return checkpoint if (a.stage, a.microbatch, a.chain) in rebuilt else 1.0
        return {K.R: 1.0 - checkpoint, K.RELOAD: 1.0}.get(a.kind, 0.0)

    problems = []
    for rank in range(schedule.ranks):
        steps = sorted((e for e in events if e.rank == rank), key=lambda e: e.step)
        held, kept, offloads = 0.0, True, []  # offloads: (event, released) so far
        compute_end = copy_end = 0.0
        for e in steps:
            actions = [a for a, _, _ in e.action_spans()]
            more = sum(added(a) for a in actions)
            held += more
            kept = kept and (limit is None or held <= limit + 1e-9)
            due = [compute_end] if e.lane == "compute" else [compute_end, copy_end]
            for a in actions:
                due += [end + (comm if producer_rank != rank else 0.0)
                        for producer_rank, end in _producers(schedule, a, ends)]
            if more > 0 and limit is not None and offloads:
                ended = next((j for j in range(len(offloads) + 1)
                              if held + sum(r for _, r in offloads[j:]) <= limit + 1e-9), len(offloads))
                if ended:
                    due.append(offloads[ended - 1][0].end)
            if abs(e.start - max(due)) > 1e-9:
                problems.append(f"rank {rank} step {e.step} {actions[0]} starts at {e.start}, not {max(due)}")
            if e.lane == "compute":
                compute_end = e.end
            else:
                copy_end = e.end
            held -= sum(release.get(a.kind, 0.0) for a in actions)
            if any(a.kind is K.OFFLOAD for a in actions):
                offloads.append((e, sum(release.get(a.kind, 0.0) for a in actions)))
        if kept and limit is not None:
            changes = sorted((t, 1 if amount > 0 else 0, amount) for e in steps for a, start, end in e.action_spans()
                             for t, amount in ((start, added(a)), (end, -release.get(a.kind, 0.0))) if amount)
            now = 0.0
            for t, _, amount in changes:
                now += amount
                if now > limit + 1e-9:
                    problems.append(f"rank {rank} holds {now} > {limit} at {t}")
                    break
    return problems


def _producers(schedule: Schedule, a: Action, ends: dict) -> list[tuple[int, float]]:
    """(rank, end) of each action ``a`` waits for (of those the timeline ran): its inputs by the rules."""
    s, m, c = a.stage, a.microbatch, a.chain
    options: list[tuple[tuple, ...]] = []
    if a.kind is K.F and s > 0:
        options = [((s - 1, K.F, m, c),)]
    elif a.kind in (K.B, K.I):
        options = [((s, K.F, m, c),), ((s, K.R, m, c),), ((s, K.RELOAD, m, c),)]
        if s < schedule.stages - 1:
            options.append(((s + 1, K.B, m, c), (s + 1, K.I, m, c)))
    elif a.kind is K.W:
        options = [((s, K.I, m, c),)]
    elif a.kind in (K.R, K.OFFLOAD):
        options = [((s, K.F, m, c),)]
    elif a.kind is K.RELOAD:
        options = [((s, K.OFFLOAD, m, c),)]
    found = []
    for need in options:
        present = [ends[option] for option in need if option in ends]
        if present:
            found.append(present[0])
    return found


def expected_receive(send: Action) -> Action:
    if send.kind is K.SEND_F:
        return Action(send.stage + 1, K.RECV_F, send.microbatch, send.chain)
    return Action(send.stage - 1, K.RECV_B, send.microbatch, send.chain)
