"""A Timeline as one self-contained HTML page: the SVG picture inline, hover tooltips, a summary.

Nothing is fetched: styles and the small tooltip script are inline. Hovering
an action shows its token, rank, start, end and duration (the SVG's own
``<title>`` tooltips still work where scripts are off). Under the picture, on
its time scale, the memory each rank holds over time (``render/memory.py``).
"""

from __future__ import annotations

from html import escape as _escape

from pipeforge.errors import printable
from pipeforge.render.memory import render_memory_svg
from pipeforge.render.svg import default_title, render_svg
from pipeforge.sim.simulate import Timeline

def escape(text: str) -> str:
    """HTML text of ``text``, its control characters escaped first (HTML cannot show them)."""
    return _escape(printable(text))


STYLE = """
body { font-family: Helvetica, Arial, sans-serif; margin: 24px; color: #222; }
table { border-collapse: collapse; margin: 12px 0; font-size: 13px; }
td, th { padding: 3px 10px; border-bottom: 1px solid #ddd; text-align: right; }
th:first-child, td:first-child { text-align: left; }
.picture { overflow-x: auto; }
rect.action:hover { stroke: #000; stroke-width: 1.5; }
#tip { position: fixed; display: none; pointer-events: none; background: #222; color: #fff;
       padding: 5px 8px; border-radius: 4px; font-size: 12px; white-space: pre; }
"""

SCRIPT = """
(function () {
  var tip = document.getElementById("tip");
  document.querySelectorAll("rect.action").forEach(function (box) {
    box.addEventListener("mousemove", function (e) {
      var d = box.dataset;
      tip.textContent = d.action + " on rank " + d.rank + "\\nstart " + d.start + "\\nend " + d.end +
                        "\\nduration " + d.duration;
      tip.style.left = (e.clientX + 14) + "px";
      tip.style.top = (e.clientY + 14) + "px";
      tip.style.display = "block";
    });
    box.addEventListener("mouseleave", function () { tip.style.display = "none"; });
  });
})();
"""


def render_html(timeline: Timeline, title: str | None = None) -> str:
    heading = title if title is not None else default_title(timeline)
    return "\n".join([
        "<!DOCTYPE html>",
        '<html lang="en">',
        "<head>",
        '<meta charset="utf-8">',
        f"<title>{escape(heading)}</title>",
        f"<style>{STYLE}</style>",
        "</head>",
        "<body>",
        f"<h2>{escape(timeline.name)}: simulated timeline</h2>",
        _summary_table(timeline),
        f'<div class="picture">{render_svg(timeline, title=heading)}</div>',
        f'<div class="picture">{render_memory_svg(timeline)}</div>',
        _rank_table(timeline),
        '<div id="tip"></div>',
        f"<script>{SCRIPT}</script>",
        "</body>",
        "</html>",
    ]) + "\n"


def _summary_table(timeline: Timeline) -> str:
    rows = [
        ("makespan", f"{timeline.makespan:g}", f"{timeline.lower_bound:g}"),
        ("bubble rate", f"{100 * timeline.bubble_rate:.2f}%", f"{100 * timeline.bubble_lower_bound:.2f}%"),
        ("peak memory (M_B)", f"{max(timeline.peak_memory, default=0):g}",
         "limit " + (f"{timeline.memory.limit:g}" if timeline.memory.limit is not None else "none")),
    ]
    body = "".join(f"<tr><td>{escape(a)}</td><td>{escape(b)}</td><td>{escape(c)}</td></tr>" for a, b, c in rows)
    return f"<table><tr><th></th><th>this schedule</th><th>lower bound</th></tr>{body}</table>"


def _rank_table(timeline: Timeline) -> str:
    head = "<tr><th>rank</th><th>busy</th><th>span</th><th>bubble</th><th>peak memory</th><th>actions</th></tr>"
    body = "".join(
        f"<tr><td>{s.rank}</td><td>{s.busy:g}</td><td>{s.span:g}</td><td>{100 * s.bubble_rate:.1f}%</td>"
        f"<td>{s.peak_memory:g}</td><td>{s.actions}</td></tr>"
        for s in timeline.rank_stats
    )
    return f"<table>{head}{body}</table>"
