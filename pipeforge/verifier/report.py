"""What ``verify`` returns: violations with their places, statistics, JSON and human text."""

from __future__ import annotations

from dataclasses import dataclass, field

from pipeforge.errors import Span, caret_block
from pipeforge.semantics import Semantics

CORE_LINES = 16
KINDS = ("syntax", "placement", "duplicate", "missing", "order", "mismatch", "deadlock", "memory")


@dataclass(frozen=True)
class Hop:
    """One link of a wait chain: ``rank`` at ``step`` waits for ``waits_for`` from rank ``peer``."""

    rank: int
    step: int | None
    step_text: str
    waits_for: str
    peer: int | None  # None: no rank owns the peer stage
    span: Span | None = field(default=None, compare=False)
    peer_finished: bool = False
    peer_step: int | None = None  # where the awaited op is, when it is known
    posted: bool = False  # the awaited op is posted, in a group of the same component: the next hop is there
    peer_group: str | None = None  # that group, as written

    @property
    def source(self) -> str:
        return "no rank (its peer stage does not exist)" if self.peer is None else f"rank {self.peer}"

    def describe(self, first: bool) -> str:
        head = f"rank {self.rank} step {self.step} ({self.step_text}) waits" if first else \
            f"which waits at step {self.step} ({self.step_text})"
        tail = f" for {self.waits_for} from {self.source}"
        if self.posted:
            tail += f", posted there at step {self.peer_step} in {self.peer_group} (one rendezvous with it)"
        elif self.peer == self.rank and self.peer_step is not None:
            tail = (f" for {self.waits_for}, which its own rank posts only later, at step {self.peer_step} "
                    f"(one rendezvous would need two steps of rank {self.rank} at once)")
        if self.peer_finished and self.peer is not None:
            tail += ", which has finished without posting it"
        return head + tail


def describe_cycle(hops: tuple[Hop, ...]) -> str:
    """``rank 1 step 4 (..) waits for 2RECV_B3 from rank 2, which waits at step 6 (..) for ...``."""
    return ", ".join(hop.describe(i == 0) for i, hop in enumerate(hops))


@dataclass(frozen=True)
class Violation:
    """One reason a schedule is invalid, placed at a rank's step and a source location."""

    kind: str
    message: str
    rank: int | None = None
    step: int | None = None
    location: str | None = None
    span: Span | None = field(default=None, compare=False, repr=False)
    cycle: tuple[Hop, ...] = field(default=(), compare=False, repr=False)
    core: tuple[str, ...] = field(default=(), compare=False, repr=False)
    grid: str | None = field(default=None, compare=False, repr=False)

    def to_json(self) -> dict:
        return {"kind": self.kind, "message": self.message, "rank": self.rank,
                "step": self.step, "location": self.location}

    def render(self) -> str:
        place = self.location or where(self.rank, self.step)
        parts = [f"{place}: {self.kind}: {self.message}" if place else f"{self.kind}: {self.message}"]
        if self.span:
            block = caret_block(self.span)
            if block:
                parts.append(block)
        parts.extend(render_hop(hop) for hop in self.cycle)
        if self.core:
            parts.append(f"  z3 unsat core ({len(self.core)} constraints):")
            parts.extend(f"    {line}" for line in self.core[:CORE_LINES])
            if len(self.core) > CORE_LINES:
                parts.append(f"    ... and {len(self.core) - CORE_LINES} more")
        if self.grid:
            parts.append("  (* marks where each rank is stuck)\n" + indent(self.grid))
        return "\n".join(parts)


def where(rank: int | None, step: int | None) -> str:
    if rank is None:
        return ""
    return f"rank {rank}" if step is None else f"rank {rank} step {step}"


def render_hop(hop: Hop) -> str:
    where = f" at {hop.span}" if hop.span else ""
    text = f"  rank {hop.rank} step {hop.step} ({hop.step_text}){where} waits for {hop.waits_for} from {hop.source}"
    if hop.posted:
        text += f" (posted, at step {hop.peer_step} in {hop.peer_group})"
    if hop.peer_finished and hop.peer is not None:
        text += " (it has finished)"
    block = caret_block(hop.span) if hop.span else ""
    return text + ("\n" + block if block else "")


def indent(text: str, prefix: str = "    ") -> str:
    return "\n".join(prefix + line if line else line for line in text.rstrip("\n").split("\n"))


@dataclass(frozen=True)
class Stats:
    ranks: int
    stages: int
    microbatches: int
    actions: int
    seconds: float
    steps: int = 0

    def to_json(self) -> dict:
        return {"ranks": self.ranks, "stages": self.stages, "microbatches": self.microbatches,
                "actions": self.actions, "seconds": round(self.seconds, 6)}


@dataclass(frozen=True)
class Report:
    """The verdict: valid (with a z3 certificate when certified) or the violations found."""

    valid: bool
    violations: tuple[Violation, ...]
    stats: Stats
    semantics: Semantics = Semantics.RENDEZVOUS
    certified: bool = False  # z3 established the timing (checked the proposal, or decided the model)
    solved: bool = False  # z3 decided the timing model with free start times (--solve)
    established: dict = field(default_factory=dict, compare=False)  # kind -> what established it

    def kinds(self) -> set[str]:
        return {v.kind for v in self.violations}

    def to_json(self) -> dict:
        return {"valid": self.valid, "violations": [v.to_json() for v in self.violations],
                "stats": self.stats.to_json(), "semantics": self.semantics, "solved": self.solved,
                "established": dict(self.established)}

    def render(self) -> str:
        if self.valid:
            how = ("decided by z3 (free start times)" if self.solved else
                   "certificate checked by z3" if self.certified else "checked without a z3 certificate")
            return f"valid: {how} ({self.stats.steps} steps, {self.stats.seconds:.2f} s)"
        count = len(self.violations)
        head = f"invalid: {count} violation{'s' if count != 1 else ''}"
        return "\n".join([head] + [v.render() for v in self.violations])
