"""The canonical .pipe text of any Schedule: explicit, and parsing back to an equal Schedule.

Every rank's steps are written as torch tokens (``0F0 (0F7;7B3) [0SEND_F1 0RECV_B0]
_ 3REDUCE_GRAD 2F0@1``), the placement as ``loop``, ``v``, ``reverse`` or an
explicit ``{ rank: [stages] }``, then costs and memory when present. The
parameters a schedule was elaborated with become the defaults of its header,
so ``load_text(print_schedule(s)) == s``.
"""

from __future__ import annotations

import re

from pipeforge.ir import ActionKind, CostModel, MemorySpec, Placement, Schedule, Step, cost_fields
from pipeforge.lang.declarations import reverse_placement

_LINE_WIDTH = 88
_INDENT = "    "
_RESERVED = frozenset({
    "schedule", "ranks", "stages", "placement", "microbatches", "require", "costs", "memory", "let", "for",
    "in", "by", "if", "elif", "else", "rank", "chain", "overlap", "group", "idle", "and", "or", "not",
    "min", "max", "loop", "v", "reverse", "_", *(kind.value for kind in ActionKind),
})


def print_schedule(schedule: Schedule) -> str:
    """The canonical text of ``schedule`` (one ``schedule`` block, ending in a newline)."""
    params = ", ".join(f"{identifier(name)} = {value}" for name, value in schedule.params)
    header = f"({params})" if params else ""
    lines = [f"schedule {identifier(schedule.name)}{header} {{"]
    lines.append(f"{_INDENT}ranks {schedule.ranks}")
    placements = ", ".join(placement_text(p, schedule.ranks) for p in schedule.placements)
    lines.append(f"{_INDENT}stages {schedule.stages} placement {placements}")
    lines.append(f"{_INDENT}microbatches {schedule.microbatches}")
    if schedule.costs is not None:
        lines.append(f"{_INDENT}{costs_text(schedule.costs)}")
    if schedule.memory is not None:
        lines.append(f"{_INDENT}{memory_text(schedule.memory)}")
    for rank, program in enumerate(schedule.programs):
        lines.extend(rank_lines(rank, program))
    lines.append("}")
    return "\n".join(lines) + "\n"


def identifier(name: str) -> str:
    """``name`` made a valid, unreserved .pipe name (names from other sources may not be)."""
    cleaned = re.sub(r"\W", "_", name, flags=re.ASCII) or "schedule"
    if cleaned[0].isdigit():
        cleaned = "s_" + cleaned
    return cleaned + "_" if cleaned in _RESERVED else cleaned


def placement_text(placement: Placement, ranks: int) -> str:
    stages = len(placement.stage_to_rank)
    style = placement.style(ranks)
    if style != "explicit":
        return style
    if placement == reverse_placement(stages, ranks):
        return "reverse"
    owners = sorted(set(placement.stage_to_rank))
    entries = ", ".join(f"{rank}: [{', '.join(map(str, placement.stages_on(rank)))}]" for rank in owners)
    return f"{{ {entries} }}"


def number(value: float) -> str:
    """A float literal the grammar reads back to the same value (``repr`` for finite floats)."""
    value = float(value)
    if value in (float("inf"), float("-inf")):
        return "1e999" if value > 0 else "-1e999"
    return repr(value)


def costs_text(costs: CostModel) -> str:
    durations = [name for name in cost_fields() if name not in ("B", "comm") and getattr(costs, name) is not None]
    entries = [f"{name} = {number(getattr(costs, name))}" for name in durations[:3]]  # F, I, W
    if costs.B is not None:
        entries.append(f"B = {number(costs.B)}")
    entries.append(f"comm = {number(costs.comm)}")
    entries.extend(f"{name} = {number(getattr(costs, name))}" for name in durations[3:])  # R, OFFLOAD, RELOAD when set
    counted: dict[tuple[int, str], float] = {}
    for stage, kind, value in costs.per_stage:
        counted.setdefault((stage, kind), value)  # the IR's first entry of a stage and kind counts
    entries.extend(f"{kind}[{stage}] = {number(value)}" for (stage, kind), value in counted.items())
    entries.extend(f"comm[{link}] = {number(value)}" for link, value in enumerate(costs.links))
    return "costs { " + "  ".join(entries) + " }"


def memory_text(memory: MemorySpec) -> str:
    entries = [] if memory.limit is None else [f"limit = {number(memory.limit)}"]
    entries.append(f"weights = {number(memory.weights)}")
    if memory.unsharded:
        entries.append(f"unsharded = {number(memory.unsharded)}")
    entries.extend(f"activation[{stage}] = {number(value)}" for stage, value in enumerate(memory.activation))
    entries.extend(f"weight_grad[{stage}] = {number(value)}" for stage, value in enumerate(memory.weight_grad))
    if memory.checkpoint:
        entries.append(f"checkpoint = {number(memory.checkpoint)}")
    entries.extend(f"checkpoint[{stage}] = {number(value)}" for stage, value in enumerate(memory.checkpoints))
    return "memory { " + "  ".join(entries) + " }"


def rank_lines(rank: int, program: tuple[Step, ...]) -> list[str]:
    if not program:
        return [f"{_INDENT}rank {rank} {{ }}"]
    lines = [f"{_INDENT}rank {rank} {{"]
    current: list[str] = []
    width = 0
    for step in program:
        token = str(step)
        if current and width + len(token) + 1 > _LINE_WIDTH:
            lines.append(_INDENT * 2 + " ".join(current))
            current, width = [], 0
        current.append(token)
        width += len(token) + 1
    lines.append(_INDENT * 2 + " ".join(current))
    lines.append(f"{_INDENT}}}")
    return lines
