"""The terminal picture of a Timeline: one row per rank, time left to right.

    rank 0 |F0 F1 F2 F3 B0    F4 B1    ...
    rank 1 |.. F0 F1 F2 B0    F3 ...

Each action is a box of columns proportional to its duration, holding its kind
and microbatch (``F3``, ``I12``) where that fits, else its kind letter; ``.``
is time the rank spends waiting (communication, bubbles).
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
    rows = [_rank_row(timeline, rank, scale, width) for rank in range(timeline.ranks)]
    lines = [f"{f'rank {rank}':<{label_width}} |{row}" for rank, row in enumerate(rows)]
    rule, labels = _axis(makespan, width)
    lines += [" " * (label_width + 2) + rule, " " * (label_width + 2) + labels]
    return "\n".join(line.rstrip() for line in lines) + "\n"


def action_label(action) -> str:
    chain = f"@{action.chain}" if action.chain else ""
    return f"{action.kind.value}{action.microbatch}{chain}"


def _rank_row(timeline: Timeline, rank: int, scale: float, width: int) -> str:
    cells = [IDLE_MARK] * width
    for event in timeline.events_on(rank):
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
        text = action.kind.value * size
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
