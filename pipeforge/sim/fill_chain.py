"""The fill chain: a bound on the worst span of every schedule of the work, over all ranks together.

For one chain with one stage a rank (stage s on rank r_s, any order of the
ranks), every (stage, microbatch) running F and a backward (I, or a fused B).
Let S_s be when rank r_s starts (its first action: an F of stage s, since
everything else on the rank needs one) and S_s + D_s when it starts its first
backward. Three facts hold in every schedule:

- ``S_{s+1} >= S_s + F_s + c``: rank r_{s+1} starts with the F of some
  microbatch, which waits for that microbatch's F on stage s (not before S_s);
- ``D_s >= F_s + c + D_{s+1} + I_{s+1} + c'``: the first backward on stage s
  (of some microbatch) waits for that microbatch's backward on stage s + 1,
  which starts no earlier than the first backward there; ``D_last >= F_last``
  (``I`` is the least backward, the cheaper of I and B; ``c``, ``c'`` the
  link's latency each way);
- before its first backward a rank runs only F (a W needs its I), each holding
  its activation until a backward releases it: at most
  ``n_s = min(m, floor(limit / activation_s))`` of them. So in the window of
  length D_s the rank is idle at least
  ``idle_s(D_s) = D_s - F_s * min(n_s, floor(D_s / F_s))``.

A rank's span is at least its compute (``busy``, as the other arguments
count it) plus that idle, so the worst span is at least
``min over D satisfying the chain of max_s (busy_s + idle_s(D_s))``. Each rank
chooses between idling until the next backward comes back (which keeps D_s,
and with it every D upstream, short) and running one more F (no idle here, but
D_s jumps to the next multiple of F_s, pushing every rank before it later,
where the limit caps how many F can fill the wait). No choice makes every rank
idle-free when the F that fill the round trips add up past the limit upstream
(with the Zero Bubble paper's costs, ``I + 2c > F``: each rank would need three
more F in flight than the rank after it, 22 on rank 0 at p = 8 where 2p
allows 16); the bound is the least worst span any choice leaves.

Computing it: for a target Z each rank may idle up to ``Z - busy_s``; taking
the smallest admissible D_s on every stage, last stage first, decides whether
some choice meets Z (every constraint is monotone in the D after it, so the
smallest choices meet Z whenever any do). Starting above every requirement,
the least Z is found by lowering Z to what the current choices need, then
asking for strictly less, until no choice meets it (``fill_chain_span``).
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass

from pipeforge.ir import ActionKind
from pipeforge.sim.workgraph import WorkGraph

_F, _B, _I = ActionKind.F, ActionKind.B, ActionKind.I
TOLERANCE = 1e-9   # as work_bounds: how far a count of F may be from the next integer and still be it
STRICT = 1e-12     # relative: "strictly less" than a worst span (scaled by it, so unit-free)
MAX_ROUNDS = 10000  # each round lowers the target; a finite number of choices, this is a safety cap


@dataclass(frozen=True)
class _Stage:
    """What the chain needs of one stage: its F, its least backward, the latency to the next stage
    (``down``) and back (``up``), how many F fit before its first backward, and its rank's busy time."""

    forward: float
    backward: float
    down: float
    up: float
    fits: int
    busy: float

    def idle(self, window: float) -> float:
        """The least idle before a first backward that starts ``window`` after the rank's start."""
        count = min(self.fits, math.floor(window / self.forward + TOLERANCE))
        return max(0.0, window - count * self.forward)

    def next_full(self, window: float) -> float | None:
        """The smallest window at or after ``window`` the rank fills with F (None: the limit forbids it)."""
        count = math.floor(window / self.forward + TOLERANCE)
        if window - count * self.forward <= TOLERANCE * self.forward:
            return window if count <= self.fits else None
        return (count + 1) * self.forward if count + 1 <= self.fits else None


def fill_chain_span(graph: WorkGraph, limit: float | None, busy: list[float]) -> float:
    """The fill chain's bound on the worst span (0 where it says nothing: several chains, a rank with
    several stages or none, a microbatch without its F or backward on some stage)."""
    stages = _stages(graph, limit, busy)
    if stages is None or any(stage.fits < 1 for stage in stages):
        return 0.0  # (no F fits: no schedule runs, nothing to bound)
    target = _needs(stages, math.inf)
    for _ in range(MAX_ROUNDS):
        if target is None:
            return 0.0  # (cannot happen: with no cap on idle every choice is admissible)
        lower = _needs(stages, target * (1.0 - STRICT))
        if lower is None:
            return target
        target = lower
    return 0.0  # nothing proved within the cap: say nothing rather than something unproved


def _needs(stages: list[_Stage], target: float) -> float | None:
    """The worst span the smallest admissible choices need when every rank may idle while its
    ``busy + idle`` stays within ``target`` (None: no choice meets the target)."""
    needed, returns = 0.0, None  # returns: from the start of the stage after to its first backward's end
    for stage in reversed(stages):
        if stage.busy > target:
            return None
        window = stage.forward if returns is None else stage.forward + stage.down + returns + stage.up
        if stage.busy + stage.idle(window) > target:
            window = stage.next_full(window)
            if window is None:
                return None
        needed = max(needed, stage.busy + stage.idle(window))
        returns = window + stage.backward
    return needed


def _stages(graph: WorkGraph, limit: float | None, busy: list[float]) -> list[_Stage] | None:
    """Each stage's numbers, first stage first (None where the argument does not apply)."""
    shape, costs = graph.shape, graph.costs
    if len(shape.placements) != 1 or shape.stages != shape.ranks or shape.stages < 1:
        return None
    to_rank = shape.placements[0].stage_to_rank
    if sorted(to_rank) != list(range(shape.ranks)) or not graph.actions:
        return None
    microbatches = _complete_microbatches(graph)
    if microbatches is None:
        return None
    found = []
    for s in range(shape.stages):
        forward = costs.duration(_F, s)
        backward = min(costs.duration(_I, s), costs.duration(_B, s))
        if forward <= 0 or backward < 0:
            return None
        activation = graph.memory.stage_effect(_F, s)[0]
        fits = microbatches if limit is None or activation <= 0 else min(
            microbatches, math.floor(limit / activation + TOLERANCE))
        down = costs.latency(s, s + 1) if s + 1 < shape.stages else 0.0
        up = costs.latency(s + 1, s) if s + 1 < shape.stages else 0.0
        found.append(_Stage(forward, backward, down, up, fits, busy[to_rank[s]]))
    return found


def _complete_microbatches(graph: WorkGraph) -> int | None:
    """m, when every stage runs exactly one F and one backward (I or B) of each of microbatches 0..m-1."""
    stages = graph.shape.stages
    lanes = Counter((a.stage, a.kind, a.microbatch) for a in graph.actions if a.kind in (_F, _I, _B))
    microbatches = {a.microbatch for a in graph.actions}
    if None in microbatches or any(a.chain != 0 for a in graph.actions):
        return None
    m = len(microbatches)
    if microbatches != set(range(m)):
        return None
    for s in range(stages):
        for mb in range(m):
            if lanes[(s, _F, mb)] != 1 or lanes[(s, _I, mb)] + lanes[(s, _B, mb)] != 1:
                return None
    return m
