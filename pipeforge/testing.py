"""Hypothesis strategies for property-testing code that reads, writes or transforms schedules.

``schedules(max_ranks=..., ...)`` draws valid schedules (their compute order consistent by construction:
a random global execution, each action appended to its rank's program); ``mutations(schedule)`` and
``mutated_schedules(...)`` break one in the ways people break them by hand (``MUTATIONS``), usually (not
always) into an invalid one. hypothesis is needed only by this module (``pip install
'pipeforge[testing]'``). An example, and how schedules are drawn: ``docs/library.md``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from hypothesis import strategies as st

from pipeforge.ir import IDLE, Action, ActionKind, MemorySpec, Placement, Schedule, Step, as_action
from pipeforge.passes.lower import lower
from pipeforge.semantics import GRADIENT_KINDS, SPLIT, memory_effect, needs, output

K = ActionKind
PLACEMENTS = ("loop", "v", "explicit")
COMMS = (None, "lower", "random")


# ------------------------------------------------------------------ valid schedules


def schedules(
    *,
    min_ranks: int = 1,
    max_ranks: int = 4,
    max_stages_per_rank: int = 2,
    min_microbatches: int = 1,
    max_microbatches: int = 6,
    placements: tuple[str, ...] = PLACEMENTS,
    split_backward: bool = True,
    overlap: bool = True,
    idle: bool = False,
    lowered: bool = False,
    comms: str | None = None,
    memory: bool = False,
) -> st.SearchStrategy[Schedule]:
    """Valid schedules (``pipeforge.verify(s).valid`` under both semantics).

    - ``min_ranks``/``max_ranks``: the number of ranks P.
    - ``max_stages_per_rank``: k; ``loop`` and ``v`` have P*k stages, ``explicit``
      between 1 and P*k stages each on a random rank (a rank may hold several
      stages, not in order, or none).
    - ``min_microbatches``/``max_microbatches``: the number of microbatches M.
    - ``placements``: which shapes to draw from: ``loop`` (stage s on rank s % P),
      ``v`` (0..P-1 then back), ``explicit``.
    - ``split_backward``: let each (stage, microbatch) draw B or I then W.
    - ``overlap``: now and then issue two ready compute actions of a rank as one
      overlap step ``(a;b)``.
    - ``idle``: sprinkle idle slots ``_`` (they mean nothing).
    - ``comms``: ``None`` compute-only; ``"lower"`` lowered by
      ``pipeforge.passes.lower``; ``"random"`` communication written by the
      strategy from the same random execution: every cross-rank edge gets its
      send and receive, posted at the same point of the execution, several
      transfers now and then batched into groups, and sometimes REDUCE_GRAD
      after a stage's last backward. ``lowered=True`` means ``comms="lower"``.
    - ``memory``: attach a ``MemorySpec`` whose limit is the peak the schedule
      reaches (so any change that holds more activations breaks it), with a
      drawn ``weights``.
    """
    if comms not in COMMS:
        raise ValueError(f"comms={comms!r}: expected one of {COMMS}")
    if not set(placements) <= set(PLACEMENTS) or not placements:
        raise ValueError(f"placements={placements!r}: choose from {PLACEMENTS}")
    options = Options(min_ranks, max_ranks, max_stages_per_rank, min_microbatches, max_microbatches,
                      tuple(placements), split_backward, overlap, idle, "lower" if lowered else comms, memory)
    return _schedules(options)


@dataclass(frozen=True)
class Options:
    min_ranks: int
    max_ranks: int
    max_stages_per_rank: int
    min_microbatches: int
    max_microbatches: int
    placements: tuple[str, ...]
    split_backward: bool
    overlap: bool
    idle: bool
    comms: str | None
    memory: bool


@st.composite
def _schedules(draw, options: Options) -> Schedule:
    ranks = draw(st.integers(options.min_ranks, options.max_ranks))
    placement = draw(placement_strategy(ranks, options))
    stages = len(placement.stage_to_rank)
    microbatches = draw(st.integers(options.min_microbatches, options.max_microbatches))
    split = {(s, m): options.split_backward and draw(st.booleans()) for s in range(stages) for m in range(microbatches)}
    run = Execution(placement, ranks, stages, microbatches, split, options.comms == "random")
    run.reduce_grad = options.comms == "random" and draw(st.booleans())
    while not run.finished():
        run.advance(draw, options)
    schedule = Schedule("random", ranks, stages, microbatches, (placement,), run.programs())
    if options.comms == "lower":
        schedule = lower(schedule)
    if options.memory:
        weights = draw(st.sampled_from([0.0, 0.25, 0.5, 0.75, 1.0]))
        schedule = replace(schedule, memory=MemorySpec(peak_memory(schedule, weights), weights))
    return schedule


def placement_strategy(ranks: int, options: Options) -> st.SearchStrategy[Placement]:
    per_rank = st.integers(1, options.max_stages_per_rank)
    choices = []
    if "loop" in options.placements:
        choices.append(per_rank.map(lambda k: Placement.loop(k * ranks, ranks)))
    if "v" in options.placements:
        choices.append(per_rank.map(lambda k: Placement.v(k * ranks, ranks)))
    if "explicit" in options.placements:
        owners = st.lists(st.integers(0, ranks - 1), min_size=1, max_size=options.max_stages_per_rank * ranks)
        choices.append(owners.map(lambda o: Placement(tuple(o))))
    return st.one_of(choices)


@dataclass(frozen=True)
class InFlight:
    """A cross-rank edge whose producer ran: ``send`` to post on ``src``, ``recv`` on ``dst``."""

    send: Action
    recv: Action
    src: int
    dst: int


class Execution:
    """A random global execution of a compute-only schedule, recorded per rank."""

    def __init__(self, placement: Placement, ranks: int, stages: int, microbatches: int,
                 split: dict, write_comms: bool):
        self.placement, self.stages, self.write_comms = placement, stages, write_comms
        self.steps: list[list[Step]] = [[] for _ in range(ranks)]
        self.todo: set[Action] = set()
        for (s, m), is_split in split.items():
            self.todo |= {Action(s, K.F, m)} | {Action(s, kind, m) for kind in (SPLIT[K.B] if is_split else (K.B,))}
        self.done: set[Action] = set()  # compute actions run, and receives completed
        self.in_flight: list[InFlight] = []
        self.reduce_grad = False
        self.backward_left = {s: microbatches for s in range(stages)}

    def finished(self) -> bool:
        return not self.todo and not self.in_flight

    def rank(self, action: Action) -> int:
        return self.placement.rank_of(action.stage)

    def needs(self, a: Action) -> list[tuple[tuple, ...]]:
        """What must have happened before ``a``: alternatives per need (a receive stands for its producer)."""
        found = []
        for producers, _, recv in needs(a, self.stages):
            crosses = recv is not None and self.placement.rank_of(producers[0][0]) != self.rank(a)
            found.append((recv,) if self.write_comms and crosses else producers)
        return found

    def ready(self) -> list[Action]:
        return sorted(a for a in self.todo if all(any(o in self.done for o in need) for need in self.needs(a)))

    def advance(self, draw, options: Options) -> None:
        ready = self.ready()
        choice = draw(st.integers(0, len(ready) - (0 if self.in_flight else 1)))
        if choice == len(ready):
            self.post_transfers(draw)
            return
        first = ready[choice]
        together = [first]
        partners = [a for a in ready if a != first and self.rank(a) == self.rank(first)]
        if options.overlap and partners and draw(st.integers(0, 4)) == 0:
            together.append(draw(st.sampled_from(partners)))
        if options.idle and draw(st.integers(0, 5)) == 0:
            self.steps[self.rank(first)].append(IDLE)
        self.run(together)

    def run(self, actions: list[Action]) -> None:
        rank = self.rank(actions[0])
        self.steps[rank].append(Step(tuple(actions), overlap=len(actions) > 1))
        for a in actions:
            self.todo.discard(a)
            self.done.add(a)
            self.start_transfers(a)
            self.maybe_reduce_grad(a)

    def start_transfers(self, a: Action) -> None:
        if not self.write_comms:
            return
        goes = output(a, self.stages)
        if goes is not None and self.placement.rank_of(goes.stage) != self.rank(a):
            self.in_flight.append(InFlight(as_action(goes.send), as_action(goes.recv), self.rank(a),
                                           self.placement.rank_of(goes.stage)))

    def maybe_reduce_grad(self, a: Action) -> None:
        if a.kind not in GRADIENT_KINDS:
            return
        self.backward_left[a.stage] -= 1
        if self.reduce_grad and self.backward_left[a.stage] == 0:
            self.steps[self.rank(a)].append(Step((Action(a.stage, K.REDUCE_GRAD),)))

    def post_transfers(self, draw) -> None:
        """Post a batch of in-flight transfers as one group per rank involved, in one order everywhere."""
        size = draw(st.integers(1, min(3, len(self.in_flight))))
        batch = [self.in_flight.pop(draw(st.integers(0, len(self.in_flight) - 1))) for _ in range(size)]
        ops: dict[int, list[Action]] = {}
        for t in batch:
            ops.setdefault(t.src, []).append(t.send)
            ops.setdefault(t.dst, []).append(t.recv)
            self.done.add(t.recv)
        for rank, actions in ops.items():
            self.steps[rank].append(Step(tuple(actions)))

    def programs(self) -> tuple[tuple[Step, ...], ...]:
        return tuple(tuple(program) for program in self.steps)


def peak_memory(schedule: Schedule, weights: float) -> float:
    """The most any rank holds (``semantics.memory_effect``; an overlap's additions count first)."""
    peak = 0.0
    for program in schedule.programs:
        held = 0.0
        for step in program:
            effects = [memory_effect(a.kind, weights) for a in step.actions]
            held += sum(added for added, _ in effects)
            peak = max(peak, held)
            held -= sum(released for _, released in effects)
    return peak


# ------------------------------------------------------------------ broken variants

MUTATIONS = ("swap_steps", "move_action", "drop_action", "duplicate_action", "reorder_receive", "regroup",
             "change_microbatch")


def mutations(schedule: Schedule, kinds: tuple[str, ...] = MUTATIONS) -> st.SearchStrategy[Schedule]:
    """One mutation of ``schedule`` (chosen among ``kinds`` that apply to it):

    - ``swap_steps``: swap two steps of one rank;
    - ``move_action``: take an action out of its step and put it on another rank;
    - ``drop_action``: delete an action;
    - ``duplicate_action``: insert a copy of an action somewhere on its rank;
    - ``reorder_receive``: move a receive to another place on its rank (out of its group);
    - ``regroup``: merge two adjacent communication groups, or split one;
    - ``change_microbatch``: give an action another microbatch (out of range when M = 1).

    The strategy cannot be drawn from for a schedule with no action at all.
    """
    unknown = set(kinds) - set(MUTATIONS)
    if unknown:
        raise ValueError(f"unknown mutations {sorted(unknown)}: choose from {MUTATIONS}")
    return _mutation(schedule, tuple(kinds))


def mutated_schedules(*, max_mutations: int = 2, kinds: tuple[str, ...] = MUTATIONS,
                      **schedule_options) -> st.SearchStrategy[Schedule]:
    """``schedules(**schedule_options)`` with 1..``max_mutations`` mutations applied."""
    @st.composite
    def build(draw) -> Schedule:
        schedule = draw(schedules(**schedule_options))
        for _ in range(draw(st.integers(1, max_mutations))):
            schedule = draw(mutations(schedule, kinds))
        return schedule

    return build()


@st.composite
def _mutation(draw, schedule: Schedule, kinds: tuple[str, ...]) -> Schedule:
    applicable = [kind for kind in kinds if APPLIES[kind](schedule)]
    if not applicable:
        return schedule
    kind = draw(st.sampled_from(applicable))
    programs = [list(program) for program in schedule.programs]
    MUTATE[kind](draw, programs, schedule)
    return replace(schedule, programs=tuple(tuple(p) for p in programs))


def positions(programs, predicate=lambda step: True) -> list[tuple[int, int]]:
    return [(r, i) for r, program in enumerate(programs) for i, step in enumerate(program)
            if not step.is_idle and predicate(step)]


def action_positions(programs, predicate=lambda a: True) -> list[tuple[int, int, int]]:
    return [(r, i, k) for r, program in enumerate(programs) for i, step in enumerate(program)
            for k, a in enumerate(step.actions) if predicate(a)]


def take(programs, r: int, i: int, k: int) -> Action:
    """Remove action k of step i on rank r (the step goes when it empties)."""
    step = programs[r][i]
    action = step.actions[k]
    rest = step.actions[:k] + step.actions[k + 1:]
    if rest:
        programs[r][i] = Step(rest, overlap=step.overlap)
    else:
        del programs[r][i]
    return action


def swap_steps(draw, programs, schedule) -> None:
    rank = draw(st.sampled_from([r for r, p in enumerate(programs) if len(p) >= 2]))
    i, j = draw(st.lists(st.integers(0, len(programs[rank]) - 1), min_size=2, max_size=2, unique=True))
    programs[rank][i], programs[rank][j] = programs[rank][j], programs[rank][i]


def move_action(draw, programs, schedule) -> None:
    r, i, k = draw(st.sampled_from(action_positions(programs)))
    action = take(programs, r, i, k)
    target = draw(st.sampled_from([q for q in range(len(programs)) if q != r]))
    programs[target].insert(draw(st.integers(0, len(programs[target]))), Step((action,)))


def drop_action(draw, programs, schedule) -> None:
    take(programs, *draw(st.sampled_from(action_positions(programs))))


def duplicate_action(draw, programs, schedule) -> None:
    r, i, k = draw(st.sampled_from(action_positions(programs)))
    programs[r].insert(draw(st.integers(0, len(programs[r]))), Step((programs[r][i].actions[k],)))


def reorder_receive(draw, programs, schedule) -> None:
    r, i, k = draw(st.sampled_from(action_positions(programs, lambda a: a.kind in (K.RECV_F, K.RECV_B))))
    alone = len(programs[r][i].actions) == 1
    action = take(programs, r, i, k)
    places = [p for p in range(len(programs[r]) + 1) if not (alone and p == i)] or [i]
    programs[r].insert(draw(st.sampled_from(places)), Step((action,)))


def regroup(draw, programs, schedule) -> None:
    splittable = positions(programs, lambda step: step.is_group and len(step.actions) >= 2)
    mergeable = [(r, i) for r, i in positions(programs, lambda step: step.is_group)
                 if i + 1 < len(programs[r]) and programs[r][i + 1].is_group]
    if splittable and (not mergeable or draw(st.booleans())):
        r, i = draw(st.sampled_from(splittable))
        actions = programs[r][i].actions
        cut = draw(st.integers(1, len(actions) - 1))
        programs[r][i:i + 1] = [Step(actions[:cut]), Step(actions[cut:])]
        return
    r, i = draw(st.sampled_from(mergeable))
    programs[r][i:i + 2] = [Step(programs[r][i].actions + programs[r][i + 1].actions)]


def change_microbatch(draw, programs, schedule) -> None:
    r, i, k = draw(st.sampled_from(action_positions(programs, lambda a: a.microbatch is not None)))
    step, action = programs[r][i], programs[r][i].actions[k]
    others = [m for m in range(schedule.microbatches) if m != action.microbatch] or [schedule.microbatches]
    changed = action._replace(microbatch=draw(st.sampled_from(others)))
    programs[r][i] = Step(step.actions[:k] + (changed,) + step.actions[k + 1:], overlap=step.overlap)


def _has_groups(schedule: Schedule) -> bool:
    programs = schedule.programs
    return bool(positions(programs, lambda s: s.is_group and len(s.actions) >= 2)) or any(
        a.is_group and b.is_group for p in programs for a, b in zip(p, p[1:]))


MUTATE = {
    "swap_steps": swap_steps, "move_action": move_action, "drop_action": drop_action,
    "duplicate_action": duplicate_action, "reorder_receive": reorder_receive, "regroup": regroup,
    "change_microbatch": change_microbatch,
}
APPLIES = {
    "swap_steps": lambda s: any(len(p) >= 2 for p in s.programs),
    "move_action": lambda s: s.ranks >= 2 and s.action_count() > 0,
    "drop_action": lambda s: s.action_count() > 0,
    "duplicate_action": lambda s: s.action_count() > 0,
    "reorder_receive": lambda s: any(a.kind in (K.RECV_F, K.RECV_B) for _, _, a in s.actions()),
    "regroup": _has_groups,
    "change_microbatch": lambda s: any(a.microbatch is not None for _, _, a in s.actions()),
}
