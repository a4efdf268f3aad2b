"""What each rank holds over time, as an SVG chart that lines up with the timeline picture.

One panel per rank, time left to right on the picture's scale (``render/svg.py``'s ``Layout``, the same
width), the rank's held memory (``Timeline.memory_curves``, M_B) as a stepped line on one scale for all
ranks, the memory limit dashed where one is declared, the rank's peak written beside it. Each line is a
``<polyline class="memory">`` with ``data-rank`` and ``data-peak`` (its largest value, the rank's
``timed_peak_memory``) and a ``<title>`` tooltip; the HTML page shows it under the picture.
"""

from __future__ import annotations

from pipeforge.render.svg import FONT, Layout, escape, fitted_width, time_axis
from pipeforge.sim.simulate import Timeline

PANEL = 54.0  # pixels of one rank's panel
GAP = 10.0
TOP = 30.0
LINE = "#c0392b"


def render_memory_svg(timeline: Timeline, *, width: float | None = None) -> str:
    """The chart as SVG text; ``width``: of the time area in pixels (default: the picture's)."""
    width = width if width is not None else fitted_width(timeline)
    layout = Layout(plot_width=max(width, 100.0), makespan=max(timeline.makespan, 1e-9))
    curves = timeline.memory_curves
    limit = timeline.memory.limit
    top_value = max([h for curve in curves for _, h in curve] + [limit or 0.0, 1e-9])
    total_width = layout.left + layout.plot_width + 90
    axis = TOP + timeline.ranks * (PANEL + GAP)
    total_height = axis + 40
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="memory-chart" width="{total_width:.0f}" '
        f'height="{total_height:.0f}" viewBox="0 0 {total_width:.0f} {total_height:.0f}" {FONT} font-size="11">',
        f'<text class="title" x="{layout.left:.1f}" y="18" font-size="13" font-weight="bold" fill="#222222">'
        f'{escape(f"memory held per rank over time (M_B; scale 0 to {top_value:g})")}</text>',
    ]
    for rank, curve in enumerate(curves):
        parts += _panel(rank, curve, timeline.timed_peak_memory[rank], limit, top_value, layout)
    parts += time_axis(layout, axis, marks=False)
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


def _panel(rank: int, curve: tuple[tuple[float, float], ...], peak: float, limit: float | None,
           top_value: float, layout: Layout) -> list[str]:
    top = TOP + rank * (PANEL + GAP)

    def y(value: float) -> float:
        return top + PANEL - value / top_value * PANEL

    points, held = [], 0.0
    for time, value in curve:
        points.append(f"{layout.x(time):.1f},{y(held):.1f}")
        points.append(f"{layout.x(time):.1f},{y(value):.1f}")
        held = value
    points.append(f"{layout.x(layout.makespan):.1f},{y(held):.1f}")
    highest = max(value for _, value in curve)
    parts = [
        f'<rect class="panel" x="{layout.left:.1f}" y="{top:.1f}" width="{layout.plot_width:.1f}" '
        f'height="{PANEL:.1f}" fill="#f7f7f7"/>',
        f'<text class="rank" x="{layout.left - 8:.1f}" y="{top + PANEL / 2 + 4:.1f}" text-anchor="end" '
        f'fill="#333333">rank {rank}</text>',
        f'<polyline class="memory" data-rank="{rank}" data-peak="{highest:g}" fill="none" stroke="{LINE}" '
        f'stroke-width="1.5" points="{" ".join(points)}"><title>rank {rank}: peak {peak:g} M_B</title></polyline>',
        f'<text class="peak" x="{layout.x(layout.makespan) + 6:.1f}" y="{top + PANEL / 2 + 4:.1f}" '
        f'fill="#333333">peak {peak:g}</text>',
    ]
    if limit is not None and limit <= top_value:
        parts.append(f'<line class="limit" x1="{layout.left:.1f}" y1="{y(limit):.1f}" '
                     f'x2="{layout.x(layout.makespan):.1f}" y2="{y(limit):.1f}" stroke="#555555" '
                     f'stroke-dasharray="4 3" stroke-width="1"><title>limit {limit:g} M_B</title></line>')
    return parts
