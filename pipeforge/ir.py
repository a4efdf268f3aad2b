"""The intermediate representation: actions, steps, placements, schedules.

Everything here is an immutable value; passes take a ``Schedule`` and return a new one. Source spans
ride along for error reports but are left out of equality. Every value has torch's text form and a
parser for it (``parse_action``, ``parse_step``): an action ``{stage}{KIND}{microbatch}`` (``2F0``,
``0SEND_F1``, ``3REDUCE_GRAD``; chain 1 of a bidirectional schedule ``2F0@1``); a step one action, an
overlap ``(0F7;7B3)``, a communication group ``[0SEND_F1 0RECV_B0]`` or idle ``_``. ``sSEND_Fm`` sends
stage s's output to stage s+1, ``sSEND_Bm`` its input gradient to s-1 (torch's direction). The IR holds
values only; the rules about them are ``semantics.py``'s.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator
from dataclasses import dataclass, field, fields, replace
from enum import Enum
from functools import partial
from typing import NamedTuple

from pipeforge.errors import Span


class ActionKind(str, Enum):
    """What an action does; its value is its text in torch's action tokens.

    A ``str`` Enum that hashes as its text (``str.__hash__``, in C), so an
    ``Action`` is a key as cheap as a plain tuple, and ``ActionKind.F == "F"``.
    What each kind consumes, produces and costs is in ``pipeforge.semantics``.
    """

    F = "F"
    B = "B"
    I = "I"  # noqa: E741 (the domain's name: backward for inputs)
    W = "W"
    SEND_F = "SEND_F"
    RECV_F = "RECV_F"
    SEND_B = "SEND_B"
    RECV_B = "RECV_B"
    REDUCE_GRAD = "REDUCE_GRAD"
    UNSHARD = "UNSHARD"
    RESHARD = "RESHARD"
    R = "R"  # recompute: the forward of (s, m) again, its activations back, before the backward
    OFFLOAD = "OFFLOAD"  # the activations of (s, m) to host memory (a copy beside the compute)
    RELOAD = "RELOAD"  # ... and back, before the backward

    __hash__ = str.__hash__
    __str__ = str.__str__
    __format__ = str.__format__  # type: ignore[assignment]  # (str's, which Enum declares otherwise)

    @property
    def is_compute(self) -> bool:
        return self in COMPUTE_KINDS

    @property
    def is_comm(self) -> bool:
        return self in COMM_KINDS

    @property
    def is_backward(self) -> bool:
        """Carries the gradient towards stage 0 (B or I)."""
        return self in (ActionKind.B, ActionKind.I)

    @property
    def has_microbatch(self) -> bool:
        return self not in STAGE_ONLY_KINDS


# The three roles of a kind (every kind has exactly one; pipeforge.semantics holds the rest of its rules).
COMPUTE_KINDS = frozenset({ActionKind.F, ActionKind.B, ActionKind.I, ActionKind.W, ActionKind.R,
                           ActionKind.OFFLOAD, ActionKind.RELOAD})
COMM_KINDS = frozenset({ActionKind.SEND_F, ActionKind.RECV_F, ActionKind.SEND_B, ActionKind.RECV_B})
STAGE_ONLY_KINDS = frozenset({ActionKind.REDUCE_GRAD, ActionKind.UNSHARD, ActionKind.RESHARD})

_KIND_ALTERNATION = "|".join(
    sorted((kind.value for kind in ActionKind), key=len, reverse=True)
)
KIND_OF_TEXT = {kind.value: kind for kind in ActionKind}
ACTION_RE = re.compile(rf"(?P<stage>[0-9]+)(?P<kind>{_KIND_ALTERNATION})(?P<mb>[0-9]*)(?:@(?P<chain>[0-9]+))?")


class Action(NamedTuple):
    """One thing a rank does to one stage (and, except REDUCE_GRAD/UNSHARD/RESHARD, one microbatch).

    A NamedTuple, as torch's ``_Action`` is: it hashes and compares in C, so it
    is the key every subsystem uses (a plain tuple ``(stage, kind, microbatch,
    chain)`` with the same fields is equal to it and hashes the same, which is
    how the hot loops of ``pipeforge.semantics`` name actions without making one).
    Ordered by stage, kind, microbatch, chain.
    """

    stage: int
    kind: ActionKind
    microbatch: int | None = None
    chain: int = 0

    def __str__(self) -> str:
        mb = "" if self.microbatch is None else str(self.microbatch)
        chain = f"@{self.chain}" if self.chain else ""
        return f"{self.stage}{self.kind._value_}{mb}{chain}"

    def __repr__(self) -> str:
        return f"Action({self})"

    @property
    def is_compute(self) -> bool:
        return self.kind in COMPUTE_KINDS

    @property
    def is_comm(self) -> bool:
        return self.kind in COMM_KINDS


make_action = partial(tuple.__new__, Action)  # Action._make without its length check: a C call


def as_action(key: tuple) -> Action:
    """The Action a key names (an Action, or a plain tuple laid out like one)."""
    if type(key) is Action:
        return key
    if type(key[1]) is ActionKind:
        return make_action(key)
    return make_action((key[0], ActionKind(key[1]), key[2], key[3]))


def parse_action(text: str) -> Action:
    """Parse one torch action token strictly (``2F0``, ``0SEND_F1``, ``1REDUCE_GRAD``, ``2F0@1``).

    Raises ``ValueError`` naming what is wrong; callers attach the location.
    Unlike torch's regex this refuses trailing text (``0BW3``) and a compute or
    communication action without a microbatch (``0F``).
    """
    match = ACTION_RE.fullmatch(text.strip())
    if match is None:
        raise ValueError(f"{text!r} is not an action: expected STAGE KIND MICROBATCH, like '2F0' or '0SEND_F1'")
    stage, kind_text, mb_text, chain_text = match.groups()
    kind = KIND_OF_TEXT[kind_text]
    mb = int(mb_text) if mb_text else None
    if kind in STAGE_ONLY_KINDS:
        if mb is not None:
            raise ValueError(f"{text!r}: {kind.value} takes no microbatch index")
    elif mb is None:
        raise ValueError(f"{text!r} needs a microbatch index after {kind.value!r}, like '{stage}{kind.value}0'")
    return make_action((int(stage), kind, mb, int(chain_text) if chain_text else 0))


_set_attribute = object.__setattr__


@dataclass(frozen=True)
class Step:
    """One slot of a rank's program.

    ``actions`` is empty for an idle slot, one action for a plain step, several
    compute actions for an overlap step, or communication actions for a group.
    A lone communication action is a group of one. ``overlap`` marks a
    parenthesised step even when it holds one action.
    """

    actions: tuple[Action, ...] = ()
    overlap: bool = False
    span: Span | None = field(default=None, compare=False, repr=False)

    def __init__(self, actions: tuple[Action, ...] = (), overlap: bool = False, span: Span | None = None):
        # what the frozen dataclass's own __init__ does: attributes set one by one keep a step one small
        # object (an update of __dict__ costs the same time and gives each step a dict of its own: twice
        # the memory, and twice the objects to free, of the 10^5 steps of a large schedule)
        _set_attribute(self, "actions", actions)
        _set_attribute(self, "overlap", overlap)
        _set_attribute(self, "span", span)
        if overlap:
            self._check()
        elif len(actions) > 1:  # one action is always a step; several, when all communicate (a group)
            for action in actions:
                if action[1] not in COMM_KINDS:
                    self._check()
                    break

    def _check(self) -> None:
        kinds = {action.is_comm for action in self.actions}
        if len(kinds) > 1:
            raise ValueError(f"step {self} mixes communication and compute actions")
        if self.overlap and any(not a.is_compute for a in self.actions):
            raise ValueError(f"overlap step {self} may hold only compute actions (F, B, I, W)")
        if len(self.actions) > 1 and not self.overlap and not self.is_group:
            raise ValueError(f"step {self} holds several actions: write an overlap '(..;..)' or a group '[.. ..]'")

    @property
    def is_idle(self) -> bool:
        return not self.actions

    @property
    def is_group(self) -> bool:
        return bool(self.actions) and self.actions[0].is_comm

    @property
    def is_compute(self) -> bool:
        return bool(self.actions) and self.actions[0].is_compute

    def __str__(self) -> str:
        if not self.actions:
            return "_"
        if self.overlap:
            return "(" + ";".join(map(str, self.actions)) + ")"
        if self.is_group and len(self.actions) > 1:
            return "[" + " ".join(map(str, self.actions)) + "]"
        return str(self.actions[0])

    def __repr__(self) -> str:
        return f"Step({self})"


IDLE = Step()


def step_of(*actions: Action, overlap: bool = False, span: Span | None = None) -> Step:
    return Step(tuple(actions), overlap, span)


def parse_step(text: str) -> Step:
    """Parse a step token: ``2F0``, ``(0F7;7B3)``, ``[0SEND_F1 0RECV_B0]`` or ``_``."""
    text = text.strip()
    if text == "_":
        return IDLE
    if text.startswith("(") and text.endswith(")"):
        parts = [p for p in text[1:-1].split(";") if p.strip()]
        return Step(tuple(parse_action(p) for p in parts), overlap=True)
    if text.startswith("[") and text.endswith("]"):
        return Step(tuple(parse_action(p) for p in text[1:-1].split()))
    return Step((parse_action(text),))


@dataclass(frozen=True)
class Placement:
    """Which rank runs each stage: ``stage_to_rank[s]`` for one chain."""

    stage_to_rank: tuple[int, ...]

    @staticmethod
    def loop(stages: int, ranks: int) -> Placement:
        """Stage s on rank s % ranks (torch's interleaved / looped placement)."""
        return Placement(tuple(s % ranks for s in range(stages)))

    @staticmethod
    def v(stages: int, ranks: int) -> Placement:
        """The V shape: down 0..P-1, then back up P-1..0, and so on (ZBV, DualPipeV)."""
        def rank_of(s: int) -> int:
            lap, offset = divmod(s, ranks)
            return offset if lap % 2 == 0 else ranks - 1 - offset

        return Placement(tuple(rank_of(s) for s in range(stages)))

    def rank_of(self, stage: int) -> int:
        return self.stage_to_rank[stage]

    def stages_on(self, rank: int) -> tuple[int, ...]:
        return tuple(s for s, r in enumerate(self.stage_to_rank) if r == rank)

    def style(self, ranks: int) -> str:
        """``loop``, ``v`` or ``explicit``: how the canonical printer writes it."""
        stages = len(self.stage_to_rank)
        if self == Placement.loop(stages, ranks):
            return "loop"
        if self == Placement.v(stages, ranks):
            return "v"
        return "explicit"


@dataclass(frozen=True)
class StepOverhead:
    """What a training step costs beyond its schedule's actions (a cost file's ``step`` and
    ``chain_sum``): ``step``, the runtime's own work once a step (splitting the batch, scaling the
    gradients); ``chain_sum[s]``, summing stage s's gradients between its two replicas on two ranks,
    which a bidirectional schedule does after its actions (0 past the end). Simulated step time =
    makespan + ``of(schedule)``."""

    step: float = 0.0
    chain_sum: tuple[float, ...] = ()

    def of(self, schedule: Schedule) -> float:
        """``step``, plus for a bidirectional schedule the most any rank spends summing its stages'
        gradients across the two chains."""
        if schedule.chains < 2 or not self.chain_sum:
            return self.step
        summing = [sum(self.chain_sum[stage] for chain in range(schedule.chains)
                       for stage in schedule.stages_on(rank, chain)
                       if stage < len(self.chain_sum) and schedule.rank_of(stage, 1 - chain) != rank)
                   for rank in range(schedule.ranks)]
        return self.step + max(summing, default=0.0)

    @property
    def given(self) -> bool:
        return self.step > 0 or any(self.chain_sum)


@dataclass(frozen=True)
class CostModel:
    """Durations of compute actions and the latency of a cross-rank edge.

    ``B`` defaults to ``I + W``. ``per_stage`` overrides one kind on one stage:
    entries ``(stage, kind, value)`` with kind one of F, B, I, W. ``links``
    overrides ``comm`` per link: ``links[s]`` is the latency of a transfer
    between stage s and stage s + 1 (either direction); links past its end cost
    ``comm``.
    Each compute kind's duration is the field of its name (``cost_fields``
    lists them for the ``--cost`` flag and ``costs { }`` blocks). ``R`` (a
    recompute) defaults to the stage's F; ``OFFLOAD`` and ``RELOAD`` (a copy
    of one microbatch's activations to host memory and back, on the rank's
    copy lane) default to the stage's F too.
    """

    F: float = 1.0
    I: float = 1.0  # noqa: E741
    W: float = 1.0
    B: float | None = None
    comm: float = 0.0
    R: float | None = None
    OFFLOAD: float | None = None
    RELOAD: float | None = None
    per_stage: tuple[tuple[int, str, float], ...] = ()
    links: tuple[float, ...] = ()
    overhead: StepOverhead = StepOverhead()  # beyond the actions, once a step (not a duration: no --cost flag)

    def latency(self, from_stage: int, to_stage: int) -> float:
        """The latency of a transfer from ``from_stage`` to ``to_stage`` across ranks."""
        link = min(from_stage, to_stage)
        if abs(from_stage - to_stage) == 1 and link < len(self.links):
            return self.links[link]
        return self.comm

    def duration(self, kind: ActionKind, stage: int) -> float:
        for s, k, value in self.per_stage:
            if s == stage and k == kind.value:
                return value
        if kind is ActionKind.B:
            if self.B is not None:
                return self.B
            return self.duration(ActionKind.I, stage) + self.duration(ActionKind.W, stage)
        if kind in COMPUTE_KINDS:
            value = getattr(self, kind._value_)  # the field named by the kind: a new compute kind adds one
            return self.duration(ActionKind.F, stage) if value is None else value  # R, OFFLOAD, RELOAD: as F
        return 0.0


@dataclass(frozen=True)
class MemorySpec:
    """Activation memory, in units of one microbatch's activations on one stage (M_B).

    F adds 1; I releases ``1 - weights``; W releases ``weights``; B releases 1.
    ``weights`` and ``weight_grad`` are finite and >= 0, and may exceed the activation
    (an I then adds the excess): ``semantics.weight_grad_problem``, which every entry asks.
    ``unsharded``: the size of one stage's gathered parameters, which UNSHARD adds
    and RESHARD releases (0: not counted). ``limit`` (None: unlimited) caps what a
    rank may hold at any time.

    Per stage (empty: every stage alike): ``activation[s]`` is what one F on stage
    s adds, in M_B (default 1); ``weight_grad[s]`` the part of it W releases
    (default ``weights * activation[s]``), so I releases the rest.

    ``checkpoint`` (``checkpoints[s]`` per stage): what an F whose (stage,
    microbatch) is recomputed (an R follows) holds instead of its activations:
    the stage's input, in M_B (default 0); R adds the rest back.
    """

    limit: float | None = None
    weights: float = 0.5
    unsharded: float = 0.0
    activation: tuple[float, ...] = ()
    weight_grad: tuple[float, ...] = ()
    checkpoint: float = 0.0
    checkpoints: tuple[float, ...] = ()

    def stage_activation(self, stage: int) -> float:
        return self.activation[stage] if stage < len(self.activation) else 1.0

    def stage_weight_grad(self, stage: int) -> float:
        if stage < len(self.weight_grad):
            return self.weight_grad[stage]
        return self.weights * self.stage_activation(stage)

    def stage_checkpoint(self, stage: int) -> float:
        """What a recomputed F of ``stage`` keeps (M_B), never more than its activation."""
        value = self.checkpoints[stage] if stage < len(self.checkpoints) else self.checkpoint
        return min(value, self.stage_activation(stage))

    def count_limit(self, limit: float | None, stages: int) -> float | None:
        """``limit`` (M_B) as a number of F a rank may hold: each adds at least the smallest stage's
        activation, so at most ``limit / min(activation)`` (what the bounds reason in)."""
        least = min((self.stage_activation(s) for s in range(stages)), default=1.0)
        if limit is None or least >= 1.0:
            return limit
        return limit / least if least > 0 else float("inf")

    def least_weights(self, stages: int) -> float:
        """The smallest ``weight_grad / activation`` of any stage (``weights`` when the stages are alike), at
        most 1: the bounds that read it take an I as releasing, and less held than is true stays a bound."""
        ratios = [self.stage_weight_grad(s) / self.stage_activation(s) for s in range(stages)
                  if self.stage_activation(s) > 0]
        return min(min(ratios, default=self.weights), 1.0)  # uniform stages too: weights may exceed 1

    @property
    def uniform(self) -> bool:
        """True when every stage holds the same (the per-stage tuples say nothing new)."""
        return not self.activation and not self.weight_grad


@dataclass(frozen=True)
class Schedule:
    """A whole pipeline schedule: who runs what, in which order.

    ``placements`` has one entry per chain (one for ordinary schedules, two for
    bidirectional ones such as Chimera, whose chain 1 runs the same stages as
    chain 0 in the opposite direction). ``programs[r]`` is rank r's steps in order.
    ``params`` records the parameter values it was elaborated with.
    """

    name: str
    ranks: int
    stages: int
    microbatches: int
    placements: tuple[Placement, ...]
    programs: tuple[tuple[Step, ...], ...]
    costs: CostModel | None = None
    memory: MemorySpec | None = None
    params: tuple[tuple[str, int], ...] = ()
    source: str | None = field(default=None, compare=False)

    @property
    def placement(self) -> Placement:
        return self.placements[0]

    @property
    def chains(self) -> int:
        return len(self.placements)

    def rank_of(self, stage: int, chain: int = 0) -> int:
        return self.placements[chain].rank_of(stage)

    def stages_on(self, rank: int, chain: int = 0) -> tuple[int, ...]:
        return self.placements[chain].stages_on(rank)

    def steps(self) -> Iterator[tuple[int, int, Step]]:
        """Every (rank, index, step), rank by rank."""
        for rank, program in enumerate(self.programs):
            for index, step in enumerate(program):
                yield rank, index, step

    def actions(self) -> Iterator[tuple[int, int, Action]]:
        """Every (rank, step index, action)."""
        for rank, index, step in self.steps():
            for action in step.actions:
                yield rank, index, action

    @property
    def is_lowered(self) -> bool:
        """True when communication is written out (by ``lower`` or by hand)."""
        return any(step.actions and step.actions[0].kind in COMM_KINDS for program in self.programs for step in program)

    def compute_only(self) -> Schedule:
        """The same schedule with communication, REDUCE_GRAD and idle slots dropped."""
        programs = tuple(
            tuple(step for step in program if step.is_compute) for program in self.programs
        )
        return replace_programs(self, programs)

    def action_count(self) -> int:
        return sum([len(step.actions) for program in self.programs for step in program])


def cost_fields() -> tuple[str, ...]:
    """The names ``--cost`` and a ``costs { }`` block accept: ``CostModel``'s number fields, in order
    (F, I, W, B, comm: not the per-stage tables ``per_stage`` and ``links``)."""
    return tuple(f.name for f in fields(CostModel) if not isinstance(f.default, (tuple, StepOverhead)))


COST_RANGE = (1e-12, 1e12)  # a nonzero duration: sums, ratios and counts of them stay far inside float's range


def cost_problem(value: float) -> str | None:
    """What is wrong with ``value`` as a duration (compute, communication, overhead), or None.

    Zero is a duration (no communication cost); otherwise it lies in ``COST_RANGE``, so
    that no sum overflows and no ratio of two durations (how many forwards fit a window)
    underflows or overflows.
    """
    low, high = COST_RANGE
    if math.isnan(value) or value < 0:
        return f"a cost must be a number >= 0, got {value!r}"
    if value != 0 and not low <= value <= high:
        return f"a nonzero cost must be between {low:g} and {high:g}, got {value!r}"
    return None


def replace_programs(schedule: Schedule, programs: tuple[tuple[Step, ...], ...]) -> Schedule:
    return replace(schedule, programs=programs)


def programs_from_tokens(rows: list[list[str]]) -> tuple[tuple[Step, ...], ...]:
    """Per-rank programs from step tokens (a convenience for tests and interop)."""
    return tuple(tuple(parse_step(token) for token in row) for row in rows)


def format_grid(schedule: Schedule, marks: dict[tuple[int, int], str] | None = None) -> str:
    """The step × rank grid torch prints in its errors, with optional marks on (rank, step)."""
    marks = marks or {}
    columns = [
        [f"{step}{marks.get((rank, i), '')}" for i, step in enumerate(program)]
        for rank, program in enumerate(schedule.programs)
    ]
    height = max((len(c) for c in columns), default=0)
    label_width = len(f"Step {max(height - 1, 0)}")
    widths = [max([len(f"Rank {r}")] + [len(cell) for cell in col]) for r, col in enumerate(columns)]
    header = " " * (label_width + 2) + " ".join(f"{f'Rank {r}':<{w}}" for r, w in enumerate(widths))
    rows = [header]
    for i in range(height):
        cells = [(col[i] if i < len(col) else "") for col in columns]
        label = f"Step {i}".ljust(label_width)
        rows.append(f"{label}: " + " ".join(f"{c:<{w}}" for c, w in zip(cells, widths)).rstrip())
    return "\n".join(rows) + "\n"
