"""Verify a schedule as torch's ``_PipelineScheduleRuntime`` (or torchtitan's launcher) will run it.

``verify_as(schedule, target="torch"|"torchtitan")`` -> ``TargetVerdict``: the program torch runs
(``passes.torch_lowering`` for a compute-only schedule; written communication as written, each action
its own batch) verified under torch's runtime's semantics on gloo (``buffered``, each receive moved to
just before its consumer, receives from one peer kept in order); pipeforge's own verdict on the compute
order; torch's refusal where it refuses the schedule; the difference where torch's lowering makes a
valid compute order invalid. ``torchtitan`` adds the launcher's placement check
(``interop.torchtitan``). The semantics, and what torch's lowering was found to do: ``docs/torch.md``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from pipeforge.ir import Action, ActionKind, Schedule, Step, replace_programs
from pipeforge.passes.torch_lowering import TorchLowering, torch_lowering, unknown_kind
from pipeforge.semantics import RECEIVES, Semantics, peer_stage
from pipeforge.verifier import verify
from pipeforge.verifier.report import KINDS, Report, Violation
from pipeforge.interop.torchtitan import Launcher, placement_violations

TARGETS = ("torch", "torchtitan")
CONSUMERS = {ActionKind.RECV_F: (ActionKind.F,), ActionKind.RECV_B: (ActionKind.B, ActionKind.I)}


@dataclass(frozen=True)
class TargetVerdict:
    """``verify --as``: the verdict on the program torch runs, and what led to it."""

    target: str
    report: Report
    compute: Report  # pipeforge's own verdict on the compute order (as ``lower`` makes it)
    lowering: TorchLowering
    placement: dict | None = None  # torchtitan: rank -> stages the launcher builds, and the settings
    _defer: bool = False

    @property
    def valid(self) -> bool:
        return self.report.valid

    @property
    def difference(self) -> str | None:
        """Set where the compute order is valid and torch's program of it is not."""
        if not self.compute.valid or self.report.valid:
            return None
        kinds = ", ".join(sorted(self.report.kinds()))
        lowering = "torch's lowering" + (" with defer_pp_recv" if self.defer_pp_recv else "")
        if self.lowering.refusal:
            return f"the compute order is valid, but torch refuses to build it: {self.lowering.refusal}"
        return f"the compute order is valid, but {lowering} makes a program that is not ({kinds})"

    @property
    def defer_pp_recv(self) -> bool:
        return self._defer

    def to_json(self) -> dict:
        found = self.report.to_json()
        program = self.lowering.program
        found["as"] = self.target
        found["torch"] = {
            "lowering": self.lowering.by,
            "defer_pp_recv": self._defer,
            "refusal": self.lowering.refusal,
            "compute_order_valid": self.compute.valid,
            "difference": self.difference,
            "program": None if program is None else [[str(s) for s in row] for row in program.programs],
        }
        if self.placement is not None:
            found["placement"] = self.placement
        return found

    def render(self) -> str:
        lines = [self.report.render()]
        if self.lowering.refusal:
            lines.append(f"torch refuses this schedule: {self.lowering.refusal}")
        if self.difference:
            lines.append(f"note: {self.difference}")
        elif self.report.valid:
            lines.append(f"as {self.target} runs it: torch's program ({self.lowering.by}'s lowering"
                         f"{', defer_pp_recv' if self._defer else ''}) checked under its runtime's semantics")
        return "\n".join(lines)


def verify_as(schedule: Schedule, target: str = "torch", *, defer_pp_recv: bool = False, use_torch: bool | None = None,
              launcher=None) -> TargetVerdict:
    """Verify ``schedule`` as ``target`` runs it; ``launcher`` (torchtitan): an ``interop.torchtitan.Launcher``."""
    compute = verify(schedule)
    refusal = unknown_kind(schedule)
    if refusal is not None:
        lowering = TorchLowering(None, refusal, "as written", dict(enumerate(schedule.placement.stage_to_rank)))
    elif schedule.is_lowered:
        lowering = TorchLowering(as_written(schedule), None, "as written",
                                 dict(enumerate(schedule.placement.stage_to_rank)))
    else:
        lowering = torch_lowering(schedule, defer_pp_recv=defer_pp_recv, use_torch=use_torch)
    if lowering.program is None:
        report = refused_report(compute, lowering.refusal or "")
    else:
        report = verify(waits_form(lowering.program), semantics=Semantics.BUFFERED)
    placement = None
    if target == "torchtitan":
        launcher = launcher or Launcher()
        placement, found = placement_violations(schedule, launcher)
        report = with_violations(report, found)
    return TargetVerdict(target, report, compute, lowering, placement, defer_pp_recv)


def as_written(schedule: Schedule) -> Schedule:
    """A schedule with written communication as torch runs its CSV: each action its own step."""
    programs = tuple(tuple(Step((action,), span=step.span) if step.is_group else step
                           for step in program if not step.is_idle for action in
                           (step.actions if step.is_group else step.actions[:1]))
                     for program in schedule.programs)
    return replace_programs(schedule, programs)


def refused_report(compute: Report, refusal: str) -> Report:
    """torch refuses at construction: the compute order's own violations say where; otherwise one saying why."""
    if not compute.valid:
        return compute
    kind = ("deadlock" if "Malformed" in refusal else "missing" if "microbatches" in refusal else
            "placement" if "compute-only" in refusal or "no action" in refusal else "order")
    violation = Violation(kind, f"torch refuses to build this schedule: {refusal}")
    return replace(compute, valid=False, violations=(violation,))


def with_violations(report: Report, extra: list[Violation]) -> Report:
    if not extra:
        return report
    violations = tuple(sorted(report.violations + tuple(extra), key=lambda v: KINDS.index(v.kind)))
    return replace(report, valid=False, violations=violations)


def waits_form(program: Schedule) -> Schedule:
    """Each receive moved to just before the compute that consumes it (where torch waits for it), never
    past a later receive from the same peer (the posting order that pairs it), never earlier than written."""
    return replace_programs(program, tuple(waits_row(row, program) for row in program.programs))


def waits_row(row: tuple[Step, ...], program: Schedule) -> tuple[Step, ...]:
    consumer = {action: index for index, step in enumerate(row) if step.is_compute for action in step.actions}
    anchors: dict[int, int] = {}
    latest: dict[int | None, int] = {}  # peer -> the anchor of the next receive from it (scanning back)
    for index in reversed(range(len(row))):
        action = row[index].actions[0] if row[index].actions else None
        if action is None or action.kind not in RECEIVES:
            continue
        used = [consumer[c] for c in consumer_actions(action) if c in consumer]
        # consumed later: wait there; consumed earlier (an order error torch fails on): stay; never: the end
        deadline = len(row) if not used else max(min(used), index)
        peer = peer_of(action, program)
        anchors[index] = min(deadline, latest.get(peer, deadline))
        latest[peer] = anchors[index]
    keyed = [((anchors[i], 0, i) if i in anchors else (i, 1, i), step) for i, step in enumerate(row)]
    return tuple(step for _, step in sorted(keyed, key=lambda pair: pair[0]))


def consumer_actions(receive: Action) -> list[Action]:
    return [Action(receive.stage, kind, receive.microbatch, receive.chain) for kind in CONSUMERS[receive.kind]]


def peer_of(action: Action, schedule: Schedule) -> int | None:
    stage = peer_stage(action)
    return schedule.rank_of(stage) if 0 <= stage < schedule.stages else None
