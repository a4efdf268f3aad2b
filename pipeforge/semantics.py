"""The rules of a pipeline schedule, written once (docs/semantics.md; DESIGN.md, "The formal model").

Every subsystem that needs a fact about actions asks here (lower, verify, the work graph that simulate,
the bounds and every optimizer time, testing, the runtime); only ``tests/verify/oracle.py`` keeps its own
copy, on purpose. One table per fact, one entry per ``ActionKind`` (``tests/test_semantics.py`` fails
when a kind is missing): ``ROLES``, ``NEEDS`` (``needs``, ``local_needs``), ``OUTPUTS``, ``MEMORY`` and
``PARAMETER_MEMORY`` (``memory_effect``, ``stage_effect``, ``held_after_additions``), ``PEER_OFFSET`` and
``PARTNER``, ``GRADIENT_KINDS``, ``SPLIT``, ``EXCLUDES``, ``COMPLETE``, ``REQUIRES``, ``RUNTIME_METHODS``; for
recompute and offload ``NEEDS_IF_PRESENT``, ``RECOMPUTED_MEMORY`` (``effects_of``), ``LANES`` and
``offload_waits`` (when an addition waits for the copy lane);
``bubble_rate``; ``early_receives``. The functions take an ``Action`` and return actions as plain ``(stage, kind,
microbatch, chain)`` tuples, equal to the Actions and hashing the same. Each rule: ``docs/semantics.md``;
where each is used: ``docs/architecture.md``.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Callable, Iterable, Iterator, Sequence
from enum import Enum
from typing import NamedTuple, TypeVar

from pipeforge.ir import COMM_KINDS, COMPUTE_KINDS, STAGE_ONLY_KINDS, Action, ActionKind, MemorySpec

F, B, I, W = ActionKind.F, ActionKind.B, ActionKind.I, ActionKind.W  # noqa: E741
SEND_F, RECV_F, SEND_B, RECV_B = ActionKind.SEND_F, ActionKind.RECV_F, ActionKind.SEND_B, ActionKind.RECV_B
REDUCE_GRAD, UNSHARD, RESHARD = ActionKind.REDUCE_GRAD, ActionKind.UNSHARD, ActionKind.RESHARD
R, OFFLOAD, RELOAD = ActionKind.R, ActionKind.OFFLOAD, ActionKind.RELOAD

ActionKey = tuple  # an Action, or a plain tuple (stage, kind, microbatch, chain) equal to one

__all__ = [
    "COMPUTE_KINDS", "COMM_KINDS", "STAGE_ONLY_KINDS", "ROLES", "NEEDS", "OUTPUTS", "MEMORY", "PARAMETER_MEMORY",
    "PEER_OFFSET", "PARTNER", "SENDS", "RECEIVES", "Semantics", "GRADIENT_KINDS", "NEEDLESS_KINDS", "SPLIT",
    "SAVING", "EXCLUDES", "INPUT_GRADIENT_KINDS",
    "COMPLETE", "SPLIT_WORK", "SPLIT_WORK_TEXTS", "PLAIN_KINDS", "REQUIRES", "DURATION_DEFAULTS",
    "RUNTIME_METHODS", "Need", "Output",
    "role", "needs", "output", "memory_effect", "stage_effect", "memory_delta", "bubble_rate", "compute_kind_names",
    "WEIGHT_GRAD_RULE", "weight_grad_problem",
    "LOCAL_KINDS", "recomputed", "offloaded", "effects_of", "needs_if_present", "NEEDS_IF_PRESENT",
    "RECOMPUTED_MEMORY", "LANES", "lane", "offload_waits",
    "held_after_additions", "MEMORY_TOLERANCE", "within_limit",
    "peer_stage", "partner", "local_needs", "split", "early_receives",
]


# --- roles ---------------------------------------------------------------------------------

ROLES: dict[ActionKind, str] = {
    **{kind: "compute" for kind in COMPUTE_KINDS},
    **{kind: "comm" for kind in COMM_KINDS},
    **{kind: "stage" for kind in STAGE_ONLY_KINDS},
}


def role(kind: ActionKind) -> str:
    """``compute``, ``comm`` or ``stage``; a kind without a role is a bug (KeyError), never skipped."""
    return ROLES[kind]


# --- what an action needs ------------------------------------------------------------------


# A need: ``(producers, send, recv)``. One input of an action: any one of ``producers`` (alternatives: B
# or I of the next stage); ``send`` and ``recv`` carry it when the producer's stage is on another rank
# than the consumer's, None when the producer is on the consumer's stage (so always on its rank).
# Plain tuples, unpacked by the callers: they are made once per action of 100k-action schedules.
Need = tuple


def _forward_needs(s: int, m: int | None, c: int, last: int) -> tuple[Need, ...]:
    if s == 0:
        return ()
    return ((((s - 1, F, m, c),), (s - 1, SEND_F, m, c), (s, RECV_F, m, c)),)


def _backward_needs(s: int, m: int | None, c: int, last: int) -> tuple[Need, ...]:
    if s >= last:
        return ((((s, F, m, c),), None, None),)  # the loss: the last stage's backward after its own forward
    later = ((s + 1, B, m, c), (s + 1, I, m, c))
    return ((((s, F, m, c),), None, None), (later, (s + 1, SEND_B, m, c), (s, RECV_B, m, c)))


def _weight_needs(s: int, m: int | None, c: int, last: int) -> tuple[Need, ...]:
    return ((((s, I, m, c),), None, None),)


def _send_forward_needs(s: int, m: int | None, c: int, last: int) -> tuple[Need, ...]:
    return ((((s, F, m, c),), None, None),)


def _send_backward_needs(s: int, m: int | None, c: int, last: int) -> tuple[Need, ...]:
    return ((((s, B, m, c), (s, I, m, c)), None, None),)


def _no_needs(s: int, m: int | None, c: int, last: int) -> tuple[Need, ...]:
    return ()


def _reload_needs(s: int, m: int | None, c: int, last: int) -> tuple[Need, ...]:
    return ((((s, OFFLOAD, m, c),), None, None),)


# REDUCE_GRAD's rule is about every B/W of its stage on the rank, not one action: see GRADIENT_KINDS.
# R and OFFLOAD need their own F (the checkpoint, or the activations to copy); RELOAD its OFFLOAD.
NEEDS: dict[ActionKind, Callable[[int, int | None, int, int], tuple[Need, ...]]] = {
    F: _forward_needs, B: _backward_needs, I: _backward_needs, W: _weight_needs,
    SEND_F: _send_forward_needs, SEND_B: _send_backward_needs, RECV_F: _no_needs, RECV_B: _no_needs,
    REDUCE_GRAD: _no_needs, ActionKind.UNSHARD: _no_needs, ActionKind.RESHARD: _no_needs,
    R: _send_forward_needs, OFFLOAD: _send_forward_needs, RELOAD: _reload_needs,
}

# kind -> the kinds of the same (stage, microbatch, chain) that, when the schedule holds them, must come
# strictly earlier on the rank: the backward uses the activations, so it comes after the R that rebuilds
# them and after the RELOAD that brings them back (and so never while they are away). Absent, they are
# not needed (a microbatch that is neither recomputed nor offloaded keeps its activations from its F).
NEEDS_IF_PRESENT: dict[ActionKind, tuple[ActionKind, ...]] = {B: (R, RELOAD), I: (R, RELOAD)}


def needs_if_present(action: ActionKey) -> tuple[ActionKey, ...]:
    """The actions ``action`` comes after when the schedule holds them (``NEEDS_IF_PRESENT``)."""
    kinds = NEEDS_IF_PRESENT.get(action[1])
    if not kinds:
        return ()
    s, _, m, c = action
    return tuple((s, kind, m, c) for kind in kinds)


# The kinds that make the gradient of their stage's input (B, I): each needs its F's activations (so after
# its R or RELOAD where there is one) and releases them.
INPUT_GRADIENT_KINDS = frozenset(kind for kind, rule in NEEDS.items() if rule is _backward_needs)

# The kinds whose every need is of their own stage (so never carried across ranks): W, R, OFFLOAD, RELOAD.
# ``lower`` skips them when it looks for cross-rank edges.
LOCAL_KINDS = frozenset(kind for kind, rule in NEEDS.items()
                        if rule is not _no_needs and all(send is None for _, send, _ in rule(1, 0, 0, 2)))

# The kinds that need nothing before them (the receives and the stage-only kinds): passes that walk
# every action skip them without asking.
NEEDLESS_KINDS = frozenset(kind for kind, rule in NEEDS.items() if rule is _no_needs)


def needs(action: ActionKey, stages: int) -> tuple[Need, ...]:
    """What ``action`` needs before it, in a schedule of ``stages`` stages (see the module doc)."""
    s, kind, m, c = action
    return NEEDS[kind](s, m, c, stages - 1)


def local_needs(action: ActionKey, stages: int, owners: tuple[int, ...],
                rank: int) -> tuple[tuple[ActionKey, ...], ...]:
    """What ``action`` on ``rank`` needs strictly earlier on that rank, one tuple of alternatives a need:
    the producer when its stage is on ``rank`` too, else the receive that carries it
    (``owners``: stage -> rank of the action's chain)."""
    found = []
    for producers, _, recv in needs(action, stages):
        if recv is None or owners[producers[0][0]] == rank:
            found.append(producers)
        else:
            found.append((recv,))
    found.extend((key,) for key in needs_if_present(action))  # same stage: on the rank when anywhere
    return tuple(found)


# --- where a compute action's output goes ----------------------------------------------------


class Output(NamedTuple):
    """Where a compute action's result is consumed: ``stage`` (same microbatch and chain), and the
    ``send`` and ``recv`` that carry it when that stage is on another rank."""

    stage: int
    send: ActionKey
    recv: ActionKey


def _forward_output(s: int, m: int | None, c: int, last: int) -> Output | None:
    return Output(s + 1, (s, SEND_F, m, c), (s + 1, RECV_F, m, c)) if s < last else None


def _backward_output(s: int, m: int | None, c: int, last: int) -> Output | None:
    return Output(s - 1, (s, SEND_B, m, c), (s - 1, RECV_B, m, c)) if s > 0 else None


def _no_output(s: int, m: int | None, c: int, last: int) -> Output | None:
    return None


# The cross-stage output of each kind (W's result, the weight gradient, stays on its stage).
OUTPUTS: dict[ActionKind, Callable[[int, int | None, int, int], Output | None]] = {
    F: _forward_output, B: _backward_output, I: _backward_output, W: _no_output,
    R: _no_output, OFFLOAD: _no_output, RELOAD: _no_output,  # R's output is dropped (F's was sent)
    **{kind: _no_output for kind in COMM_KINDS | STAGE_ONLY_KINDS},
}


def output(action: ActionKey, stages: int) -> Output | None:
    """The stage that consumes ``action``'s result and what carries it there (None: none does)."""
    s, kind, m, c = action
    return OUTPUTS[kind](s, m, c, stages - 1)


# --- memory --------------------------------------------------------------------------------

# kind -> (added, released, released per weight gradient), in units of the stage's activation a and
# its weight gradient w (uniform stages: a = 1 M_B, w = weights): F adds a; B releases a; I a - w; W w.
# OFFLOAD releases a (the copy leaves device memory), RELOAD adds it back; R: see RECOMPUTED_MEMORY.
MEMORY: dict[ActionKind, tuple[float, float, float]] = {
    F: (1.0, 0.0, 0.0), B: (0.0, 1.0, 0.0), I: (0.0, 1.0, -1.0), W: (0.0, 0.0, 1.0),
    R: (1.0, 0.0, 0.0), OFFLOAD: (0.0, 1.0, 0.0), RELOAD: (1.0, 0.0, 0.0),
    **{kind: (0.0, 0.0, 0.0) for kind in COMM_KINDS | STAGE_ONLY_KINDS},
}

# kind -> what it adds when its (stage, microbatch, chain) is recomputed (the schedule holds its R), as
# (per activation a, per checkpoint c): its F keeps only the checkpoint (the stage's input), R adds the rest.
RECOMPUTED_MEMORY: dict[ActionKind, tuple[float, float]] = {F: (0.0, 1.0), R: (1.0, -1.0)}


# kind -> (added, released) of one stage's gathered parameters, in units of their size u (``memory {
# unsharded = u }``, M_B; 0: not counted): UNSHARD gathers them, RESHARD frees them.
PARAMETER_MEMORY: dict[ActionKind, tuple[float, float]] = {UNSHARD: (1.0, 0.0), RESHARD: (0.0, 1.0)}


def memory_effect(kind: ActionKind, weights: float, activation: float = 1.0,
                  weight_grad: float | None = None, unsharded: float = 0.0,
                  checkpoint: float | None = None) -> tuple[float, float]:
    """``(added, released)`` memory of one ``kind`` action, in M_B, on a stage whose F holds
    ``activation`` (default 1) and holds ``weight_grad`` from its I to its W (default ``weights * activation``;
    more than ``activation`` where the gradients I leaves for W outweigh what it frees: that I adds the rest)
    and whose gathered parameters take ``unsharded``; ``checkpoint``: the (stage, microbatch) is
    recomputed and its F keeps that much (None: it is not; R is always of a recomputed one).
    ``stage_effect`` asks here with a stage's sizes."""
    added, released, per_weight = MEMORY[kind]
    rebuilt = RECOMPUTED_MEMORY.get(kind)
    if rebuilt is not None and checkpoint is not None:
        added = rebuilt[0] + rebuilt[1] * (checkpoint / activation if activation else 0.0)
    grad = weights * activation if weight_grad is None else weight_grad
    gathered, freed = PARAMETER_MEMORY.get(kind, (0.0, 0.0))
    adds = added * activation + gathered * unsharded
    releases = released * activation + per_weight * grad + freed * unsharded
    if releases < 0:  # an I that holds more until its W than its F left (the gradients it leaves W): it adds the rest
        return adds - releases, 0.0
    return adds, releases


WEIGHT_GRAD_RULE = ("what a stage holds from its I until its W (weights: as a share of its activation); "
                    "above the activation the I adds the excess")


def weight_grad_problem(value: object) -> str | None:
    """What is wrong with ``value`` as a weight gradient, or None: ``weights`` (M_W / M_B, ``--cost
    weights=X``, ``memory { weights = X }``), ``weight_grad[s]`` (M_B) and a cost or layer file's
    ``weight_grad`` (its memory unit) are each a finite number >= 0, with no upper bound (``memory_effect``
    makes an I that holds more than its F left add the excess). Every entry asks here and names its place."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        return f"expected a finite number >= 0, got {value!r}: {WEIGHT_GRAD_RULE}"
    return None


def stage_effect(memory: MemorySpec, kind: ActionKind, stage: int, recomputed: bool = False) -> tuple[float, float]:
    """``(added, released)`` of one ``kind`` action on ``stage`` under ``memory``: F adds the stage's
    activation (its checkpoint when its (stage, microbatch) is ``recomputed``), R the rest, B releases it,
    I all but its weight_grad (adds the excess of a larger one), W that; OFFLOAD releases it, RELOAD adds
    it; UNSHARD adds ``unsharded``, RESHARD releases it (M_B)."""
    return memory_effect(kind, memory.weights, memory.stage_activation(stage), memory.stage_weight_grad(stage),
                         memory.unsharded, memory.stage_checkpoint(stage) if recomputed else None)


def recomputed(actions: Iterable[ActionKey]) -> set[tuple]:
    """The ``(stage, microbatch, chain)`` of every R among ``actions``: whose F keeps only its checkpoint."""
    return {(key[0], key[2], key[3]) for key in actions if key[1] is R or key[1] == "R"}


def offloaded(actions: Iterable[ActionKey]) -> set[tuple]:
    """The ``(stage, microbatch, chain)`` of every OFFLOAD among ``actions``: whose forward saves into a holder."""
    return {(key[0], key[2], key[3]) for key in actions if key[1] is OFFLOAD or key[1] == "OFFLOAD"}


def effects_of(memory, actions: Iterable[ActionKey]) -> Callable[[ActionKey], tuple[float, float]]:
    """``(added, released)`` of each action of a schedule that holds ``actions``, on ``memory``'s sizes
    (an ``ir.MemorySpec``; ``stage_effect``), an F of a recomputed (stage, microbatch, chain) keeping only
    its checkpoint; verify's memory check, simulate's peak and the work graph all look effects up here."""
    rebuilt = recomputed(actions)
    cache: dict[tuple, tuple[float, float]] = {}

    def effect(key: ActionKey) -> tuple[float, float]:
        kind = key[1]
        flag = kind == "R" or (bool(rebuilt) and kind == "F" and (key[0], key[2], key[3]) in rebuilt)
        found = cache.get((kind, key[0], flag))
        if found is None:
            found = cache[kind, key[0], flag] = stage_effect(memory, ActionKind(kind), key[0], flag)
        return found

    return effect


MEMORY_TOLERANCE = 1e-9  # how far past a limit what a rank holds may read and still be within it (float sums)


def within_limit(held: float, limit: float | None) -> bool:
    """``held`` (M_B) within ``limit`` (None: none), by ``MEMORY_TOLERANCE``: verify's memory check, simulate's
    ``within_limit`` and every optimizer's feasibility test ask here."""
    return limit is None or held <= limit + MEMORY_TOLERANCE


def held_after_additions(steps: Iterable[Iterable[tuple[float, float]]]) -> Iterator[float]:
    """For each step of a rank's program (the ``(added, released)`` of its actions), what the rank
    holds after the step's additions and before its releases: verify compares it with the limit,
    simulate's peak memory is the largest (an overlap step ``(0F7;7B3)`` counts its F first)."""
    held = 0.0
    for effects in steps:
        released = 0.0
        for added, freed in effects:
            held += added
            released += freed
        yield held
        held -= released


def memory_delta(kind: ActionKind, weights: float) -> float:
    """What one ``kind`` action changes a rank's held activations by."""
    added, released = memory_effect(kind, weights)
    return added - released


# --- the bubble rate -------------------------------------------------------------------------


def bubble_rate(mean_busy: float, longest_span: float) -> float:
    """The Zero Bubble paper's bubble rate, ``1 - mean(busy) / max(span)`` over the ranks (0 for an
    empty span): simulate's rate of a timeline, the bounds' least rates and optimize's metrics all ask
    here."""
    return 1.0 - mean_busy / longest_span if longest_span > 0 else 0.0


# --- how communication completes ------------------------------------------------------------

class Semantics(str, Enum):
    """The readings of communication ``verify`` checks a schedule under (docs/semantics.md): ``rendezvous``
    (a send and its receive complete together), ``buffered`` (a send completes once posted, a receive once
    its send is), ``nccl`` (every op once its partner is posted). A ``str`` Enum like ``ActionKind``:
    ``Semantics.NCCL == "nccl"``, and its text in JSON and messages."""

    RENDEZVOUS = "rendezvous"
    BUFFERED = "buffered"
    NCCL = "nccl"

    __hash__ = str.__hash__
    __str__ = str.__str__
    __format__ = str.__format__  # type: ignore[assignment]  # (str's, which Enum declares otherwise)


# --- communication peers -------------------------------------------------------------------

PEER_OFFSET: dict[ActionKind, int] = {SEND_F: 1, RECV_B: 1, RECV_F: -1, SEND_B: -1}
PARTNER: dict[ActionKind, ActionKind] = {SEND_F: RECV_F, RECV_F: SEND_F, SEND_B: RECV_B, RECV_B: SEND_B}
SENDS = frozenset({SEND_F, SEND_B})
RECEIVES = frozenset({RECV_F, RECV_B})


def peer_stage(action: ActionKey) -> int:
    """The stage at the other end of a communication action."""
    offset = PEER_OFFSET.get(action[1])
    if offset is None:
        raise ValueError(f"{Action(*action) if type(action) is not Action else action} is not a communication action")
    return action[0] + offset


def partner(action: ActionKey) -> ActionKey:
    """The action the peer must post to meet communication action ``action``."""
    s, kind, m, c = action
    return (s + PEER_OFFSET[kind], PARTNER[kind], m, c)


Receive = TypeVar("Receive", bound=ActionKey)  # early_receives returns the kind of key it is given


def early_receives(receives: Iterable[Receive], peer_of: Callable[[Receive], int | None],
                   ready: Callable[[Receive], bool]) -> list[Receive]:
    """The receives of one rank's program (``receives``, in the order the program posts them) that may be
    posted together at the start of the program, in that order (docs/semantics.md, "Receives posted early").

    The k-th send from a peer meets the k-th receive from it, so a receive may go ahead of its step as
    long as it stays behind every earlier receive from the same peer rank: per peer, the longest run of
    its receives, from its first, that are ``ready`` (their buffers known). Nothing else moves: its wait
    stays where its data is used. Only where posting a receive never blocks and each op progresses on its
    own (gloo); not NCCL, whose ops of one communicator run in posting order on one stream.
    """
    stopped: set[int | None] = set()
    early = []
    for receive in receives:
        peer = peer_of(receive)
        if peer in stopped:
            continue
        if ready(receive):
            early.append(receive)
        else:
            stopped.add(peer)
    return early


# --- what generated code calls --------------------------------------------------------------

# kind -> the ``pipeforge.runtime.RankContext`` method a generated rank function calls for it (a kind
# left out would be refused by codegen with a clear error).
RUNTIME_METHODS: dict[ActionKind, str] = {
    F: "forward", B: "backward", I: "backward_input", W: "backward_weight",
    SEND_F: "send_f", RECV_F: "recv_f", SEND_B: "send_b", RECV_B: "recv_b", REDUCE_GRAD: "reduce_grad",
    ActionKind.UNSHARD: "unshard", ActionKind.RESHARD: "reshard",
    R: "recompute", OFFLOAD: "offload", RELOAD: "reload",
}

# kind -> the lane of its rank it runs on: the compute lane (one action at a time, in program order), or
# the copy lane beside it (a copy stream: OFFLOAD and RELOAD, one transfer at a time, overlapping compute).
LANES: dict[ActionKind, str] = {OFFLOAD: "copy", RELOAD: "copy"}


def lane(kind: ActionKind) -> str:
    """``compute`` or ``copy`` (``LANES``; every kind not named there runs on the compute lane)."""
    return LANES.get(kind, "compute")


def offload_waits(steps: Iterable[tuple[float, float, bool]], limit: float | None) -> list[int | None]:
    """For each step of a rank's program, given as ``(added, released, is_offload)`` (the step's effects
    summed; ``is_offload``: an OFFLOAD step), the index of the OFFLOAD step whose end it waits for before
    its additions start, or None (docs/semantics.md, "Recompute and offload", the copy lane rule).

    A step that adds memory (F, R, RELOAD) waits only when the memory needs it: counting what is held the
    program-order way (``held_after_additions``: ``h``) but each earlier OFFLOAD's release only from its
    transfer's end, it waits for the earliest OFFLOAD ``o_j`` such that ``h`` plus the releases of the
    OFFLOADs written after ``o_j`` (and before it) is within ``limit`` (1e-9 tolerance); the copy lane ends
    its transfers in program order, so once ``o_j`` has ended, what is still in flight is among those. No
    limit (None): never waits. ``h`` over the limit (a schedule verify refuses): waits for the last one.
    So what a rank holds in time never passes a limit its program keeps; ``h``'s largest value stays what
    verify checks, simulate reports as ``peak_memory`` and the runtime counts (its ``timed_peak_memory`` is
    the timed one, each release at its transfer's end)."""
    waits: list[int | None] = []
    positions: list[int] = []  # the OFFLOAD steps so far, in order
    totals: list[float] = [0.0]  # totals[i]: releases of the first i of them
    held = 0.0
    for index, (added, released, is_offload) in enumerate(steps):
        held += added
        wait = None
        if added > 0 and limit is not None and positions:
            room = limit + MEMORY_TOLERANCE - held  # how much of the releases may still be in flight
            need = totals[-1] - room  # the releases that must have ended, at least
            if need > 0:
                ended = max(1, bisect_left(totals, need))  # the fewest OFFLOADs ended, first ones first, that cover it
                wait = positions[min(ended, len(positions)) - 1]
        waits.append(wait)
        held -= released
        if is_offload:
            positions.append(index)
            totals.append(totals[-1] + released)
    return waits


def waited_offload(kinds: Sequence[ActionKind]) -> int:
    """The position, in an OFFLOAD step (its actions' kinds), of the action whose end a wait on that step
    (``offload_waits``) waits for: its last OFFLOAD. The copy lane ends a rank's transfers in program order,
    so all of the step's OFFLOADs have ended then; an overlap step may hold an OFFLOAD beside other actions,
    whose releases a later step follows anyway (it is issued once the compute before it has ended)."""
    return max(i for i, kind in enumerate(kinds) if kind is OFFLOAD)


# --- gradients and completeness ------------------------------------------------------------

GRADIENT_KINDS = frozenset({B, W})  # a stage's weight gradient is complete after its last B or W on a rank
SPLIT: dict[ActionKind, tuple[ActionKind, ...]] = {B: (I, W)}  # B is I then W (the Zero Bubble split)
SAVING = frozenset({R, OFFLOAD, RELOAD})  # the kinds that save a (stage, microbatch)'s memory: recompute, offload
EXCLUDES: dict[ActionKind, frozenset[ActionKind]] = {
    B: frozenset({I, W}), I: frozenset({B}), W: frozenset({B}),
    R: frozenset({OFFLOAD, RELOAD}), OFFLOAD: frozenset({R}), RELOAD: frozenset({R}),  # one way to save memory
}
# What one (stage, microbatch) runs in a complete schedule: F and B, or F and B's parts (sorted by kind).
COMPLETE: tuple[tuple[ActionKind, ...], ...] = (tuple(sorted((F, B))), tuple(sorted((F, *SPLIT[B]))))
# The split work of one (stage, microbatch): F, then B's parts (I, W), what every order search orders;
# ``SPLIT_WORK_TEXTS`` their texts (the keys of the Zero Bubble and list schedulers' tables).
SPLIT_WORK: tuple[ActionKind, ...] = (F, *SPLIT[B])
SPLIT_WORK_TEXTS: tuple[str, ...] = tuple(kind.value for kind in SPLIT_WORK)
# The kinds of a schedule without recompute and offload (F, B, I, W): what optimize reorders.
PLAIN_KINDS = frozenset(kind for alternative in COMPLETE for kind in alternative)


# kind -> the kinds the same (stage, microbatch) must also hold when it holds this one (else ``missing``,
# even beside a B: W without I).
REQUIRES: dict[ActionKind, tuple[ActionKind, ...]] = {W: (I,), OFFLOAD: (RELOAD,), RELOAD: (OFFLOAD,)}


# kind -> the kinds whose durations its own defaults to the sum of (a cost file or ``--cost`` may leave it
# out): B = I + W (``ir.CostModel.duration`` applies it).
DURATION_DEFAULTS: dict[ActionKind, tuple[ActionKind, ...]] = {B: SPLIT[B], R: (F,), OFFLOAD: (F,), RELOAD: (F,)}


def compute_kind_names() -> tuple[str, ...]:
    """The compute kinds' texts in a stable order (F, B, I, W, then any other): what the runtime's
    hooks, traces, cost files and the profiler iterate over instead of spelling them."""
    order = {"F": 0, "B": 1, "I": 2, "W": 3}
    return tuple(sorted((kind.value for kind in COMPUTE_KINDS), key=lambda text: (order.get(text, 9), text)))


def split(action: Action) -> tuple[Action, ...]:
    """``action`` as the actions it is made of: a B as I then W, anything else as itself."""
    parts = SPLIT.get(action.kind)
    if parts is None:
        return (action,)
    return tuple(action._replace(kind=kind) for kind in parts)
