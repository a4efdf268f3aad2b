"""The terminal picture of a Timeline: one row per rank, time left to right.

    rank 0 |F0 F1 F2 F3 B0    F4 B1    ...
    rank 1 |.. F0 F1 F2 B0    F3 ...

Each action is a box of columns proportional to its duration, holding its kind
and microbatch (``F3``, ``I12``) where that fits, else its kind letter; ``.``
is time the rank spends waiting (communication, bubbles). A rank that offloads
has a ``copy`` row under it: its copy lane (``O3`` offloads microbatch 3, ``L3`` reloads it).
"""

from __future__ import annotations

import math

from pipeforge.sim.simulate import Timeline

IDLE_MARK = "."


def render_text(timeline: Timeline, width: int = 100) -> str:
    """The grid, ``width`` columns of time wide (plus the rank labels), and a time axis."""
    makespan = timeline.makespan
    if makespan <= 0 or not timeline.events:
        return "(no compute actions)\n"
    scale = max(width, 1) / makespan
    label_width = len(f"rank {timeline.ranks - 1}")
    lines = []
    copying = {e.rank for e in timeline.events if e.lane == "copy"}
    for rank in range(timeline.ranks):
        lines.append(f"{f'rank {rank}':<{label_width}} |{_rank_row(timeline, rank, scale, width, 'compute')}")
        if rank in copying:  # the rank's copy lane (OFFLOAD, RELOAD) under its compute
            lines.append(f"{'  copy':<{label_width}} |{_rank_row(timeline, rank, scale, width, 'copy')}")
    rule, labels = _axis(makespan, width)
    lines += [" " * (label_width + 2) + rule, " " * (label_width + 2) + labels]
    return "\n".join(line.rstrip() for line in lines) + "\n"


SHORT = {"OFFLOAD": "O", "RELOAD": "L"}  # one letter a kind in the grid: O0 offloads microbatch 0, L0 reloads it


def action_label(action) -> str:
    chain = f"@{action.chain}" if action.chain else ""
    return f"{SHORT.get(action.kind.value, action.kind.value)}{action.microbatch}{chain}"


def _rank_row(timeline: Timeline, rank: int, scale: float, width: int, lane: str = "compute") -> str:
    cells = [IDLE_MARK if lane == "compute" else " "] * width
    for event in timeline.events_on(rank):
        if event.lane != lane:
            continue
        for action, start, end in event.action_spans():
            first = min(int(round(start * scale)), width - 1)
            last = max(int(round(end * scale)), first + 1)
            _draw_box(cells, first, min(last, width), action)
    return "".join(cells)


def _draw_box(cells: list[str], first: int, last: int, action) -> None:
    size = last - first
    label = action_label(action)
    if size >= len(label):  # "F1F2" still reads as two boxes: every label starts with its kind letter
        text = label.ljust(size)
    else:
        text = SHORT.get(action.kind.value, action.kind.value)[0] * size
    cells[first:last] = list(text)


def _axis(makespan: float, width: int) -> tuple[str, str]:
    """A rule with a '+' at each round-numbered tick, and the tick values under it."""
    rule = ["-"] * width
    labels = [" "] * (width + 8)
    step = nice_step(makespan)
    for tick in ticks(makespan, step):
        column = min(int(round(tick * width / makespan)), width - 1)
        rule[column] = "+"
        text = _number(tick)
        if all(c == " " for c in labels[max(column - 1, 0):column + len(text) + 1]):
            labels[column:column + len(text)] = list(text)
    return "".join(rule), "".join(labels).rstrip()


def ticks(extent: float, step: float) -> list[float]:
    """0, step, 2 step, ... up to ``extent`` (multiplied, not summed, so no rounding drift)."""
    count = int(math.floor(extent / step + 1e-9)) if step > 0 else 0
    return [round(i * step, 12) for i in range(count + 1)]


def nice_step(extent: float, ticks: int = 10) -> float:
    """A round tick step (1, 2 or 5 times a power of ten) giving at most about ``ticks`` ticks."""
    if extent <= 0:
        return 1.0
    raw = extent / ticks
    power = 10 ** math.floor(math.log10(raw))
    for multiple in (1, 2, 5, 10):
        if multiple * power >= raw:
            return multiple * power
    return 10 * power


def _number(value: float) -> str:
    return f"{value:.0f}" if abs(value - round(value)) < 1e-9 else f"{value:g}"
