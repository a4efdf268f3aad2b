"""torch_lowering: the program torch's ``_PipelineScheduleRuntime`` runs for a compute-only schedule.

``torch_lowering(schedule, defer_pp_recv=...)`` gives each rank's actions as torch's ``_load_csv`` builds
them (idle cells dropped, ``_validate_schedule``, ``_add_unshard_reshard``, ``_add_reduce_grad``,
``_add_send_recv``, and ``_defer_recv_ops`` with ``defer_pp_recv``), one action a step, each inserted step
carrying the span of the compute step it serves. It runs torch's own functions when torch is importable
and an equal reimplementation otherwise (``by`` says which; tests/passes check they agree); where torch
refuses, the result holds torch's message instead of a program. How torch lowers: ``docs/torch.md``.
"""

from __future__ import annotations

from collections import defaultdict
from typing import NamedTuple, cast

from pipeforge.ir import (
    Action,
    ActionKind,
    Schedule,
    Step,
    parse_action,
    replace_programs,
)
from pipeforge.passes.unshard import unshard_program

K = ActionKind
MAX_ACTIVE_STAGES = 3  # torch's default, which _prepare_schedule_with_comms does not change


class TorchLowering(NamedTuple):
    """torch's program for a schedule (one action a step), or why torch refuses to build it."""

    program: Schedule | None
    refusal: str | None
    by: str  # "torch" (its own functions ran) or "pipeforge" (the reimplementation)
    stage_to_rank: dict[int, int]


def torch_lowering(schedule: Schedule, *, defer_pp_recv: bool = False, use_torch: bool | None = None) -> TorchLowering:
    """What ``_PipelineScheduleRuntime`` makes of the compute-only ``schedule`` (see the module docstring;
    ``use_torch``: torch's own functions, default where torch is importable)."""
    if use_torch is None:
        use_torch = torch_available()
    rows = [[step for step in program if not step.is_idle] for program in schedule.programs]
    stage_to_rank = {s: r for s, r in enumerate(schedule.placements[0].stage_to_rank)}
    by = "torch" if use_torch else "pipeforge"
    refusal = not_compute_only(schedule)
    if refusal is not None:
        return TorchLowering(None, refusal, by, stage_to_rank)
    lower_rows = _lower_with_torch if use_torch else _lower_here
    lowered, refusal = lower_rows(rows, schedule, stage_to_rank, defer_pp_recv)
    if refusal is not None:
        return TorchLowering(None, refusal, by, stage_to_rank)
    return TorchLowering(replace_programs(schedule, with_spans(lowered, schedule)), None, by, stage_to_rank)


TORCH_KINDS = frozenset({K.F, K.B, K.I, K.W, K.SEND_F, K.RECV_F, K.SEND_B, K.RECV_B, K.REDUCE_GRAD, K.UNSHARD,
                         K.RESHARD})  # torch's _ComputationType, less OVERLAP_F_B (an overlap step here)


def unknown_kind(schedule: Schedule) -> str | None:
    """The first action of a kind torch has no action for (pipeforge's R, OFFLOAD, RELOAD), named."""
    for rank, index, action in schedule.actions():
        if action.kind not in TORCH_KINDS:
            return (f"rank {rank} step {index}: {str(action)!r}: torch's runtime has no action {action.kind.value} "
                    f"(_Action.from_str refuses it)")
    return None


def not_compute_only(schedule: Schedule) -> str | None:
    """``_prepare_schedule_with_comms``'s check (format compute_only): every cell F, B, I, W or an overlap
    (torch's own GPipe dump ends its rows with REDUCE_GRAD, which it then refuses to load); and a kind
    torch has no action for (pipeforge's R, OFFLOAD, RELOAD), which its CSV reader refuses."""
    refusal = unknown_kind(schedule)
    if refusal is not None:
        return refusal
    for rank, program in enumerate(schedule.programs):
        for position, step in enumerate(program):
            if step.actions and not step.is_compute:
                return (f"Expected compute-only schedule but found communication action '{step.actions[0]}' at "
                        f"rank {rank}, position {position}. Communication actions (e.g. SEND_F, RECV_F, etc.) "
                        f"should not be present when format='compute_only'.")
    return None


def torch_available() -> bool:
    try:
        from torch.distributed.pipelining import schedules  # noqa: F401
    except ImportError:
        return False
    return True


# --- with torch's own functions ----------------------------------------------------------------


def _lower_with_torch(rows, schedule: Schedule, stage_to_rank: dict[int, int], defer: bool):
    from torch.distributed.pipelining import schedules as ts

    order = {rank: [ts._Action.from_str(cell(step)) for step in row] for rank, row in enumerate(rows)}
    try:
        ts._validate_schedule(order, schedule.ranks, schedule.stages, schedule.microbatches)
        # cast: torch annotates _add_unshard_reshard's result list[_Action] and _add_reduce_grad's argument
        # list[_Action | None], which it only reads (skipping a None)
        order = {rank: ts._add_reduce_grad(cast("list[ts._Action | None]",
                                                ts._add_unshard_reshard(actions, MAX_ACTIVE_STAGES)),
                                           schedule.microbatches)
                 for rank, actions in order.items()}
        lowered = ts._add_send_recv(order, stage_to_rank=stage_to_rank.__getitem__, num_stages=schedule.stages)
        if defer:
            lowered = ts._defer_recv_ops(lowered, stage_to_rank=stage_to_rank.__getitem__)
    except (AssertionError, ValueError, KeyError) as refused:
        return None, first_line(refused)
    return [[step_of(str(action)) for action in lowered[rank]] for rank in range(schedule.ranks)], None


def cell(step: Step) -> str:
    """A step as torch's CSV cell (an overlap with torch's suffix)."""
    if step.overlap:
        return "(" + ";".join(map(str, step.actions)) + ")OVERLAP_F_B"
    return str(step.actions[0])


def step_of(text: str) -> Step:
    if text.endswith("OVERLAP_F_B"):
        return Step(tuple(parse_action(part) for part in text[1:text.index(")")].split(";")), overlap=True)
    return Step((parse_action(text),))


def first_line(error: BaseException) -> str:
    """torch's message without the schedule it appends, its whitespace runs made single spaces."""
    return " ".join(str(error).strip().split("\n\n")[0].split()) or type(error).__name__


# --- the reimplementation ----------------------------------------------------------------------


def _lower_here(rows, schedule: Schedule, stage_to_rank: dict[int, int], defer: bool):
    refusal = validate(rows, schedule)
    if refusal is not None:
        return None, refusal
    staged = [add_reduce_grad(list(unshard_program(tuple(row), MAX_ACTIVE_STAGES)), schedule.microbatches)
              for row in rows]
    lowered, refusal = add_send_recv(staged, stage_to_rank, schedule.stages)
    if refusal is None and defer:
        lowered, refusal = defer_recv_ops(lowered, stage_to_rank)
    return lowered, refusal


def validate(rows, schedule: Schedule) -> str | None:
    """torch's ``_validate_schedule``: its first complaint, in its words, or None."""
    if len(rows) != schedule.ranks:
        return f"Schedule has incorrect number of ranks - expected {schedule.ranks}, actual {len(rows)}"
    seen: dict[int, dict[ActionKind, set]] = {s: {K.F: set(), K.B: set(), K.I: set(), K.W: set()}
                                              for s in range(schedule.stages)}
    owner: dict[int, int] = {}
    needs = {K.B: (K.F, "Full Backward", "Forward"), K.I: (K.F, "Backward Input", "Forward"),
             K.W: (K.I, "Backward Weight", "Backward Input")}
    for rank, row in enumerate(rows):
        for index, step in enumerate(row):
            for action in step.actions:
                stage, kind, mb = action.stage, action.kind, action.microbatch
                if kind in needs and stage in seen:
                    before, what, first = needs[kind]
                    if mb not in seen[stage][before]:
                        return (f"Rank {rank}, step {index}: Running {what} for stage {stage}, microbatch {mb} "
                                f"without first running {first}")
                if kind in seen.get(stage, {}):
                    seen[stage][kind].add(mb)
                if owner.setdefault(stage, rank) != rank:
                    return (f"Rank {rank}, step {index}: Stage {stage} is assigned to both rank {rank} and rank "
                            f"{owner[stage]}")
    return counts_complaint(seen, schedule.microbatches)


def counts_complaint(seen, microbatches: int) -> str | None:
    for stage, kinds in seen.items():
        f, b, i, w = (len(kinds[k]) for k in (K.F, K.B, K.I, K.W))
        if f != microbatches:
            return f"Got {f} F microbatches for stage {stage}, expected {microbatches}"
        if i != w:
            return (f"Invalid backward microbatches for stage {stage}: I and W must have equal counts, "
                    f"but got I={i}, W={w}")
        if b + (i + w) // 2 != microbatches:
            return (f"Invalid backward microbatches for stage {stage}: expected {microbatches} total backwards, "
                    f"but got B={b}, I={i}, W={w}")
    return None


def add_reduce_grad(row: list[Step], microbatches: int) -> list[Step]:
    """torch's ``_add_reduce_grad``: REDUCE_GRAD of a stage right after its M-th B or W on the rank."""
    count: dict[int, int] = defaultdict(int)
    out: list[Step] = []
    for step in row:
        out.append(step)
        for action in step.actions if step.is_compute else ():
            if action.kind in (K.B, K.W):
                count[action.stage] += 1
                if count[action.stage] == microbatches:
                    out.append(Step((Action(action.stage, K.REDUCE_GRAD),)))
    return out


def add_send_recv(rows: list[list[Step]], stage_to_rank: dict[int, int], stages: int):
    """torch's ``_add_send_recv``: the lowered rows, or torch's complaint when it cannot place them."""
    out: list[list[Step]] = [[] for _ in rows]
    done: list[set] = [set() for _ in rows]
    position = [0] * len(rows)
    for rank, row in enumerate(rows):
        if not row:
            return None, f"rank={rank}, len(compute_actions[rank])=0"
    pending = set(range(len(rows)))
    while pending:
        progress = False
        for rank in sorted(pending):
            step = rows[rank][position[rank]]
            if not all(ready(action, done[rank], stages) for action in step.actions):
                continue
            out[rank].append(step)
            for action in step.actions:
                done[rank].add(action)
                carried = comms(action, stage_to_rank, stages)
                if carried is not None:
                    send, recv = carried
                    out[rank].append(Step((send,)))
                    done[rank].add(send)
                    out[stage_to_rank[recv.stage]].append(Step((recv,)))
                    done[stage_to_rank[recv.stage]].add(recv)
            position[rank] += 1
            if position[rank] == len(rows[rank]):
                pending.discard(rank)
            progress = True
        if not progress:
            return None, "Malformed compute schedule, can't schedule sends/recvs"
    return out, None


def ready(action: Action, done: set, stages: int) -> bool:
    stage, kind, mb = action.stage, action.kind, action.microbatch
    if kind is K.F and stage != 0:
        return Action(stage, K.RECV_F, mb) in done or Action(stage - 1, K.F, mb) in done
    if kind in (K.I, K.B) and stage != stages - 1:
        return (Action(stage, K.RECV_B, mb) in done or Action(stage + 1, K.I, mb) in done
                or Action(stage + 1, K.B, mb) in done)
    return True


def comms(action: Action, stage_to_rank: dict[int, int], stages: int) -> tuple[Action, Action] | None:
    """The send and receive torch adds after ``action`` (``_has_comms``/``_get_comms``), if any."""
    stage, kind, mb = action.stage, action.kind, action.microbatch
    if kind is K.F and stage != stages - 1 and stage_to_rank[stage + 1] != stage_to_rank[stage]:
        return Action(stage, K.SEND_F, mb), Action(stage + 1, K.RECV_F, mb)
    if kind in (K.I, K.B) and stage != 0 and stage_to_rank[stage - 1] != stage_to_rank[stage]:
        return Action(stage, K.SEND_B, mb), Action(stage - 1, K.RECV_B, mb)
    return None


def defer_recv_ops(rows: list[list[Step]], stage_to_rank: dict[int, int]):
    """torch's ``_defer_recv_ops`` (without pipeforge's FIFO rule: this is what torch runs)."""
    out = []
    for rank, row in enumerate(rows):
        deferred: dict[tuple, Step] = {}
        new: list[Step] = []
        for step in row:
            action = step.actions[0]
            if action.kind in (K.RECV_F, K.RECV_B):
                deferred[(action.stage, action.kind, action.microbatch)] = step
                continue
            if action.kind in (K.SEND_F, K.SEND_B):
                peer = send_peer(action, stage_to_rank)
                if rank < peer:
                    for key in [k for k, v in deferred.items() if recv_peer(v.actions[0], stage_to_rank) == peer]:
                        new.append(deferred.pop(key))
            for sub in step.actions:
                wanted = {K.F: K.RECV_F, K.B: K.RECV_B, K.I: K.RECV_B}.get(sub.kind)
                key = (sub.stage, wanted, sub.microbatch)
                if wanted is not None and key in deferred:
                    new.append(deferred.pop(key))
            new.append(step)
        if deferred:
            left = [str(step.actions[0]) for step in deferred.values()]
            return None, (f"Malformed input schedule on rank {rank}: leftover RECV ops with no consumer found: {left}")
        out.append(new)
    return out, None


def send_peer(action: Action, stage_to_rank: dict[int, int]) -> int:
    return stage_to_rank[action.stage + 1 if action.kind is K.SEND_F else action.stage - 1]


def recv_peer(action: Action, stage_to_rank: dict[int, int]) -> int:
    return stage_to_rank[action.stage - 1 if action.kind is K.RECV_F else action.stage + 1]


# --- spans -------------------------------------------------------------------------------------


def with_spans(rows: list[list[Step]], schedule: Schedule) -> tuple[tuple[Step, ...], ...]:
    """Each step with a place in the source: a compute step its own cell, a send its producer's, a
    receive its consumer's, a stage-only step the compute step before it (or after, at the start)."""
    span_of = {action: step.span for _, _, step in schedule.steps() for action in step.actions if step.is_compute}
    programs = []
    for row in rows:
        spans = [step_span(step, span_of) for step in row]
        programs.append(tuple(Step(step.actions, step.overlap, fill(spans, i)) for i, step in enumerate(row)))
    return tuple(programs)


CONSUMER = {K.RECV_F: K.F, K.RECV_B: K.B, K.SEND_F: K.F}


def step_span(step: Step, span_of: dict):
    action = step.actions[0]
    if step.is_compute:
        return span_of.get(action)
    if action.kind is K.SEND_B:
        return span_of.get(Action(action.stage, K.B, action.microbatch)) or \
            span_of.get(Action(action.stage, K.I, action.microbatch))
    if action.kind is K.RECV_B:
        return span_of.get(Action(action.stage, K.B, action.microbatch)) or \
            span_of.get(Action(action.stage, K.I, action.microbatch))
    if action.kind in CONSUMER:
        return span_of.get(Action(action.stage, CONSUMER[action.kind], action.microbatch))
    return None


def fill(spans: list, index: int):
    if spans[index] is not None:
        return spans[index]
    for other in list(range(index - 1, -1, -1)) + list(range(index + 1, len(spans))):
        if spans[other] is not None:
            return spans[other]
    return None
