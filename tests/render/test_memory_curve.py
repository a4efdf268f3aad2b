"""The memory curve per rank over time: ``Timeline.memory_curves``, the HTML page's chart, the trace's counters.

The curve's largest value is the rank's ``peak_memory`` and it ends at 0, on every library schedule,
as written and fully recomputed, 2 and 4 ranks; fully offloaded, it never passes a limit the program keeps
(the copy lane rule), and is the ``timed_peak_memory``; a hand case pins its points; the HTML
page draws one line per rank with that peak (and the limit); the Chrome trace's counters are the same
points; ``pipeforge show -o x.html`` writes the chart.
"""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET

import pytest

import pipeforge
from pipeforge.cli import main
from pipeforge.interop.chrome_trace import trace_events
from pipeforge.ir import MemorySpec
from pipeforge.library import names
from pipeforge.passes.recompute import offload, recompute
from pipeforge.render.html import render_html
from pipeforge.render.memory import render_memory_svg
from pipeforge.sim import simulate

SVG = "{http://www.w3.org/2000/svg}"
TRANSFORMS = {"plain": lambda s: s, "recompute": recompute, "offload": offload}


def library_timelines():
    for name in names():
        for ranks in (2, 4):
            try:
                base = pipeforge.load(name, defines={"P": ranks, "M": 2 * ranks})
            except pipeforge.SemanticError:
                continue
            for how, transform in TRANSFORMS.items():
                timeline = simulate(transform(base))
                if how == "offload":  # under the limit the program keeps, the copy lane rule holds the curve to it
                    limit = max(timeline.peak_memory)
                    timeline = simulate(transform(base), memory=MemorySpec(limit=limit))
                yield f"{name} P={ranks} {how}", timeline


def test_the_curve_peaks_at_the_ranks_peak_memory_and_ends_empty():
    checked = 0
    for label, timeline in library_timelines():
        for rank, curve in enumerate(timeline.memory_curves):
            values = [held for _, held in curve]
            assert max(values) == timeline.timed_peak_memory[rank], (label, rank)
            if "offload" in label:
                assert max(values) <= timeline.memory.limit + 1e-9, (label, rank)
            else:
                assert max(values) == pytest.approx(timeline.peak_memory[rank]), (label, rank)
            assert min(values) >= -1e-9 and abs(values[-1]) < 1e-9, (label, rank)
            assert [t for t, _ in curve] == sorted({t for t, _ in curve}), (label, rank)
            checked += 1
    assert checked > 100


def test_a_hand_case():
    # 1F1B, 2 ranks, 2 microbatches, unit costs (B = 2): rank 1 runs F0 1..2, B0 2..4, F1 4..5, B1 5..7,
    # so rank 0 runs F0 0..1, F1 1..2, B0 4..6 and B1 7..9
    timeline = simulate(pipeforge.load("1f1b", defines={"P": 2, "M": 2}))
    assert timeline.memory_curves[0] == ((0.0, 1.0), (1.0, 2.0), (6.0, 1.0), (9.0, 0.0))
    assert timeline.memory_curves[1] == ((0.0, 0.0), (1.0, 1.0), (7.0, 0.0))  # at 4 B0 frees, F1 takes it
    # recomputed, with a checkpoint of 0.25: F keeps 0.25, R adds the other 0.75 before B
    rebuilt = pipeforge.loads("schedule r() { ranks 1 stages 1 placement loop microbatches 1 "
                              "memory { checkpoint = 0.25 } rank 0 { F(0, 0) R(0, 0) B(0, 0) } }")
    assert simulate(rebuilt).memory_curves[0] == ((0.0, 0.25), (1.0, 1.0), (4.0, 0.0))


def test_the_html_page_draws_each_ranks_curve_with_its_peak_and_the_limit():
    schedule = offload(pipeforge.load("zb-h1", defines={"P": 4, "M": 8}))
    timeline = simulate(schedule, memory=MemorySpec(limit=3.0))
    page = render_html(timeline)
    chart = re.search(r'<svg[^>]*class="memory-chart".*?</svg>', page, re.S)
    assert chart is not None
    root = ET.fromstring(chart.group(0))
    lines = [e for e in root.iter(f"{SVG}polyline") if e.get("class") == "memory"]
    assert [int(e.get("data-rank")) for e in lines] == [0, 1, 2, 3]
    assert [float(e.get("data-peak")) for e in lines] == list(timeline.timed_peak_memory)
    assert max(timeline.timed_peak_memory) <= 3.0  # the copy lane rule keeps the limit in time too
    assert len([e for e in root.iter(f"{SVG}line") if e.get("class") == "limit"]) == 4
    assert ET.fromstring(render_memory_svg(simulate(pipeforge.load("1f1b", defines={"P": 2, "M": 2})))) is not None


def test_the_trace_counters_are_the_curve():
    timeline = simulate(recompute(pipeforge.load("interleaved-1f1b", defines={"P": 2, "M": 4})))
    counters = [e for e in trace_events(timeline) if e["ph"] == "C"]
    for rank, curve in enumerate(timeline.memory_curves):
        mine = [(e["ts"] / 1000.0, e["args"]["M_B"]) for e in counters if e["name"] == f"rank {rank} memory"]
        assert mine == list(curve)


def test_show_writes_the_chart(tmp_path):
    out = tmp_path / "page.html"
    assert main(["show", "zbv", "-D", "P=2", "-D", "M=4", "-o", str(out)]) == 0
    page = out.read_text(encoding="utf-8")
    assert page.count('class="memory"') == 2 and "memory held per rank over time" in page
    trace = tmp_path / "trace.json"
    assert main(["show", "zbv", "-D", "P=2", "-D", "M=4", "-o", str(trace)]) == 0
    names_ = {e["name"] for e in json.loads(trace.read_text())["traceEvents"] if e["ph"] == "C"}
    assert names_ == {"rank 0 memory", "rank 1 memory"}
