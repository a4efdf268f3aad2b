"""A Timeline as an SVG picture in the style of the pipeline papers' figures.

One row per rank, time left to right; one box per action coloured by kind
(F blue, B green, I teal, W purple; the second chain of a bidirectional
schedule in deeper shades), the microbatch number inside where it fits, gaps
(communication and bubbles) left as the pale row background. A time axis runs
under the rows; the title carries the schedule's name, bubble rate, makespan
and peak memory; a legend names the kinds present.

Each action's ``<rect>`` has ``class="action KIND"``, ``data-*`` attributes
(action, rank, start, end, duration) and a ``<title>`` tooltip; the HTML
renderer builds on these.
"""

from __future__ import annotations

from dataclasses import dataclass
from xml.sax.saxutils import escape as _escape, quoteattr as _quoteattr

from pipeforge.errors import printable
from pipeforge.render.grid import nice_step, ticks
from pipeforge.sim.simulate import Timeline

# (fill, text colour) by (kind, shade): shade 0 light as in the papers; shade 1 deeper, for a rank's
# second stage (V and interleaved placements: odd local chunks) or for chain 1 (bidirectional schedules).
def escape(text: str) -> str:
    """XML text of ``text``, its control characters escaped first (XML 1.0 cannot hold them at all)."""
    return _escape(printable(text))


def quoteattr(text: str) -> str:
    """An XML attribute value of ``text``, its control characters escaped first."""
    return _quoteattr(printable(text))


PALETTE = {
    ("F", 0): ("#a8c8f0", "#10243f"), ("F", 1): ("#3f6fb5", "#ffffff"),
    ("B", 0): ("#9edbb0", "#0f3319"), ("B", 1): ("#2f8f55", "#ffffff"),
    ("I", 0): ("#8fd3d0", "#0c3533"), ("I", 1): ("#23857f", "#ffffff"),
    ("W", 0): ("#cdb4ea", "#2a1545"), ("W", 1): ("#7a52b0", "#ffffff"),
    ("R", 0): ("#f3c89b", "#3d2208"), ("R", 1): ("#c0762e", "#ffffff"),
    ("OFFLOAD", 0): ("#f0a8a8", "#3f1010"), ("OFFLOAD", 1): ("#b53f3f", "#ffffff"),
    ("RELOAD", 0): ("#e8d98a", "#3a330a"), ("RELOAD", 1): ("#a8952a", "#ffffff"),
}
KIND_NAMES = {"F": "forward", "B": "backward", "I": "backward (inputs)", "W": "backward (weights)",
              "R": "recompute", "OFFLOAD": "to host (copy lane)", "RELOAD": "back from host (copy lane)"}
NEUTRAL = (("#dddddd", "#222222"), ("#888888", "#ffffff"))  # a compute kind without colours of its own


def colours(kind: str, shade: int) -> tuple[str, str]:
    return PALETTE.get((kind, shade), NEUTRAL[shade])
FONT = "font-family=\"Helvetica, Arial, sans-serif\""


@dataclass(frozen=True)
class Layout:
    """Pixel geometry: where time 0 is, how wide a unit of time is, row heights."""

    left: float = 64.0
    top: float = 58.0
    row_height: float = 26.0
    row_gap: float = 4.0
    plot_width: float = 1000.0
    makespan: float = 1.0

    @property
    def scale(self) -> float:
        return self.plot_width / self.makespan if self.makespan > 0 else 1.0

    def x(self, time: float) -> float:
        return self.left + time * self.scale

    def y(self, rank: int) -> float:
        return self.top + rank * (self.row_height + self.row_gap)

    def bottom(self, ranks: int) -> float:
        return self.y(ranks) - self.row_gap


def render_svg(timeline: Timeline, title: str | None = None, *, width: float | None = None) -> str:
    """The picture as SVG text; ``width`` is the width of the time area in pixels (default: fitted)."""
    width = width if width is not None else fitted_width(timeline)
    layout = Layout(plot_width=max(width, 100.0), makespan=max(timeline.makespan, 1e-9))
    shades = Shades(timeline)
    total_width = layout.left + layout.plot_width + 24
    total_height = layout.bottom(timeline.ranks) + 46
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{total_width:.0f}" height="{total_height:.0f}" '
        f'viewBox="0 0 {total_width:.0f} {total_height:.0f}" {FONT} font-size="11">',
        f'<rect class="background" x="0" y="0" width="{total_width:.0f}" height="{total_height:.0f}" fill="#ffffff"/>',
        _title(timeline, title, layout),
        _legend(timeline, layout, shades),
        *_rows(timeline, layout),
        *_actions(timeline, layout, shades),
        *time_axis(layout, layout.bottom(timeline.ranks) + 6),
        "</svg>",
    ]
    return "\n".join(part for part in parts if part) + "\n"


def default_title(timeline: Timeline) -> str:
    peak = max(timeline.peak_memory, default=0.0)
    return (f"{timeline.name}: bubble rate {100 * timeline.bubble_rate:.1f}%, "
            f"makespan {timeline.makespan:g}, peak memory {peak:g} M_B")


def _title(timeline: Timeline, title: str | None, layout: Layout) -> str:
    text = title if title is not None else default_title(timeline)
    return (f'<text class="title" x="{layout.left:.1f}" y="22" font-size="14" font-weight="bold" '
            f'fill="#222222">{escape(text)}</text>')


def fitted_width(timeline: Timeline) -> float:
    """Wide enough for a two-digit label in the shortest action, within 1000..2400 pixels."""
    shortest = min((d for e in timeline.events for d in e.durations if d > 0), default=1.0)
    wanted = timeline.makespan / shortest * 17.0
    return min(max(wanted, 1000.0), 2400.0)


class Shades:
    """Which shade each action gets: deeper for odd local chunks and for chain 1."""

    def __init__(self, timeline: Timeline):
        stages_on: dict[int, set[int]] = {}
        for event in timeline.events:
            for action in event.actions:
                if action.chain == 0:
                    stages_on.setdefault(event.rank, set()).add(action.stage)
        self.chunk = {(rank, stage): index for rank, stages in stages_on.items()
                      for index, stage in enumerate(sorted(stages))}
        self.has_chunks = any(index > 0 for index in self.chunk.values())
        self.has_chains = any(a.chain for e in timeline.events for a in e.actions)

    def of(self, rank: int, action) -> int:
        return (action.chain + self.chunk.get((rank, action.stage), 0)) % 2

    def note(self) -> str:
        if self.has_chains and self.has_chunks:
            return "deeper: chain 1, or a rank's second stage"
        if self.has_chains:
            return "deeper: chain 1"
        return "deeper: a rank's second stage" if self.has_chunks else ""


def _legend(timeline: Timeline, layout: Layout, shades: Shades) -> str:
    present = sorted({(a.kind.value, shades.of(e.rank, a)) for e in timeline.events for a in e.actions},
                     key=lambda ks: ("FBIW".find(ks[0]) % 5, ks[0], ks[1]))
    items, x = [], layout.left
    for kind, shade in present:
        fill, _ = colours(kind, shade)
        items.append(f'<rect class="legend" x="{x:.1f}" y="33" width="12" height="12" fill="{fill}" '
                     f'stroke="#555555" stroke-width="0.5"/>')
        x += 14
        if shade == 0 and (kind, 1) in present:
            continue  # the deeper square follows the light one, under one label
        label = f"{kind} {KIND_NAMES.get(kind, 'compute')}"
        items.append(f'<text class="legend" x="{x + 2:.1f}" y="43.5" fill="#333333">{escape(label)}</text>')
        x += 2 + 6.0 * len(label) + 14
    if shades.note():
        items.append(f'<text class="legend-note" x="{x:.1f}" y="43.5" fill="#666666">({escape(shades.note())})</text>')
    return "\n".join(items)


def _rows(timeline: Timeline, layout: Layout) -> list[str]:
    rows = []
    for rank in range(timeline.ranks):
        y = layout.y(rank)
        rows.append(f'<rect class="row" x="{layout.left:.1f}" y="{y:.1f}" width="{layout.plot_width:.1f}" '
                    f'height="{layout.row_height:.1f}" fill="#f2f2f2"/>')
        rows.append(f'<text class="rank" x="{layout.left - 8:.1f}" y="{y + layout.row_height / 2 + 4:.1f}" '
                    f'text-anchor="end" fill="#333333">rank {rank}</text>')
    return rows


def _actions(timeline: Timeline, layout: Layout, shades: Shades) -> list[str]:
    out = []
    copying = {e.rank for e in timeline.events if e.lane == "copy"}
    for event in timeline.events:
        # a rank that offloads: compute in the upper part of its row, its copy lane in a strip under it
        band = None if event.rank not in copying else ("copy" if event.lane == "copy" else "compute")
        for action, start, end in event.action_spans():
            out.append(_action_box(action, event.rank, start, end, layout, shades.of(event.rank, action), band))
        if len(event.actions) > 1:
            out.append(_overlap_outline(event, layout))
    return out


COPY_BAND = 0.3  # of a row: the copy lane's strip, under the compute of a rank that offloads


def _action_box(action, rank: int, start: float, end: float, layout: Layout, shade: int,
                band: str | None = None) -> str:
    kind = action.kind.value
    fill, ink = colours(kind, shade)
    x, y = layout.x(start), layout.y(rank)
    height = layout.row_height
    if band == "compute":
        height *= 1 - COPY_BAND
    elif band == "copy":
        y, height = y + height * (1 - COPY_BAND), height * COPY_BAND
    w = max((end - start) * layout.scale, 0.5)
    tip = f"{action} on rank {rank}{' (copy lane)' if band == 'copy' else ''}: {start:g} to {end:g} ({end - start:g})"
    rect = (f'<rect class="action {kind}" x="{x:.2f}" y="{y:.1f}" width="{w:.2f}" height="{height:.1f}" '
            f'fill="{fill}" stroke="#ffffff" stroke-width="1" data-action={quoteattr(str(action))} '
            f'data-rank="{rank}" data-start="{start:g}" data-end="{end:g}" data-duration="{end - start:g}">'
            f'<title>{escape(tip)}</title></rect>')
    label = str(action.microbatch)
    if w < 6.5 * len(label) + 3 or band == "copy":
        return rect
    text = (f'<text class="label" x="{x + w / 2:.2f}" y="{y + height / 2 + 4:.1f}" '
            f'text-anchor="middle" fill="{ink}" pointer-events="none">{escape(label)}</text>')
    return rect + text


def _overlap_outline(event, layout: Layout) -> str:
    x, y = layout.x(event.start), layout.y(event.rank)
    w = (event.end - event.start) * layout.scale
    return (f'<rect class="overlap" x="{x:.2f}" y="{y + 1:.1f}" width="{w:.2f}" height="{layout.row_height - 2:.1f}" '
            f'fill="none" stroke="#333333" stroke-width="1.2" stroke-dasharray="3 2" pointer-events="none"/>')


def time_axis(layout: Layout, base: float, *, marks: bool = True) -> list[str]:
    """The time axis along y = ``base``: its line, the value of every tick (under a 4-unit mark where
    ``marks``, the values 2 lower then) and "time (cost units)" at its end (the Gantt's and the memory chart's)."""
    below = 2 if marks else 0
    parts = [f'<line class="axis" x1="{layout.left:.1f}" y1="{base:.1f}" x2="{layout.x(layout.makespan):.1f}" '
             f'y2="{base:.1f}" stroke="#555555" stroke-width="1"/>']
    step = nice_step(layout.makespan, ticks=max(2, int(layout.plot_width // 70)))
    for tick in ticks(layout.makespan, step):
        x = layout.x(tick)
        if marks:
            parts.append(f'<line class="tick" x1="{x:.1f}" y1="{base:.1f}" x2="{x:.1f}" y2="{base + 4:.1f}" '
                         f'stroke="#555555" stroke-width="1"/>')
        parts.append(f'<text class="tick" x="{x:.1f}" y="{base + (14 + below):.1f}" text-anchor="middle" '
                     f'fill="#444444">{tick:g}</text>')
    parts.append(f'<text class="axis-label" x="{layout.x(layout.makespan):.1f}" y="{base + (30 + below):.1f}" '
                 f'text-anchor="end" fill="#444444">time (cost units)</text>')
    return parts
