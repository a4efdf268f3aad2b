"""The text grid, the SVG, the HTML page and the PNG of a timeline."""

from __future__ import annotations

import xml.etree.ElementTree as ET

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pipeforge
from pipeforge.errors import UsageError
from pipeforge.ir import CostModel, Placement
from pipeforge.render.grid import nice_step, render_text
from pipeforge.render.html import render_html
from pipeforge.render.svg import render_svg
from pipeforge.sim import simulate
from tests.sim.sim_orders import one_f_one_b, random_consistent, schedule_of

SVG = "{http://www.w3.org/2000/svg}"


@pytest.fixture(scope="module")
def zb_h1():
    return simulate(pipeforge.load("zb-h1", defines={"P": 4, "M": 8}))


def action_count(timeline) -> int:
    return sum(len(event.actions) for event in timeline.events)


def test_grid_has_one_row_per_rank_with_labels_and_waits():
    text = render_text(simulate(one_f_one_b(4, 8), CostModel(F=1, I=1, W=1)), width=99)
    rows = [line for line in text.splitlines() if line.startswith("rank")]
    assert len(rows) == 4
    assert rows[0].startswith("rank 0 |F0 F1 F2 F3 ...")
    assert rows[3].startswith("rank 3 |.........F0 B0")
    assert all(len(row) <= len("rank 0 |") + 99 for row in rows)
    assert "F7" in rows[3] and "B7" in rows[0]


def test_grid_falls_back_to_letters_when_boxes_are_narrow():
    rows = render_text(simulate(one_f_one_b(4, 32)), width=40).splitlines()[:4]
    assert "FF" in rows[0] and "F12" not in rows[0]


def test_grid_axis_has_round_ticks():
    text = render_text(simulate(one_f_one_b(4, 8), CostModel(F=1, I=1, W=1)), width=99)
    assert text.splitlines()[-1].split() == ["0", "5", "10", "15", "20", "25", "30"]


@pytest.mark.parametrize("extent, step", [(33, 5), (9, 1), (1456.7, 200), (0.3, 0.05), (100, 10)])
def test_nice_steps(extent, step):
    assert nice_step(extent) == pytest.approx(step)


def test_svg_is_well_formed_with_one_rect_per_action(zb_h1):
    root = ET.fromstring(render_svg(zb_h1))
    rects = [r for r in root.iter(f"{SVG}rect") if r.get("class", "").startswith("action")]
    assert len(rects) == action_count(zb_h1)
    assert {r.get("class") for r in rects} == {"action F", "action I", "action W"}
    first = next(r for r in rects if r.get("data-action") == "0F0")
    assert (first.get("data-start"), first.get("data-end")) == ("0", "1")
    assert first.find(f"{SVG}title").text.startswith("0F0 on rank 0")


def test_svg_title_names_schedule_bubble_and_memory(zb_h1):
    root = ET.fromstring(render_svg(zb_h1))
    title = next(t for t in root.iter(f"{SVG}text") if t.get("class") == "title").text
    assert title == "zb_h1: bubble rate 11.1%, makespan 27, peak memory 4 M_B"
    legend = [t.text for t in root.iter(f"{SVG}text") if t.get("class") == "legend"]
    assert legend == ["F forward", "I backward (inputs)", "W backward (weights)"]
    ranks = [t.text for t in root.iter(f"{SVG}text") if t.get("class") == "rank"]
    assert ranks == ["rank 0", "rank 1", "rank 2", "rank 3"]


def test_svg_escapes_a_hostile_title(zb_h1):
    root = ET.fromstring(render_svg(zb_h1, title='<script>"&'))
    assert next(t for t in root.iter(f"{SVG}text") if t.get("class") == "title").text == '<script>"&'


def test_svg_draws_overlap_steps_back_to_back_with_an_outline():
    rows = [["0F0", "0F1", "(0B0;0F2)", "0B1", "0B2"]]
    timeline = simulate(schedule_of(rows, stages=1, microbatches=3, placement=Placement((0,))))
    root = ET.fromstring(render_svg(timeline))
    assert len([r for r in root.iter(f"{SVG}rect") if r.get("class") == "overlap"]) == 1
    boxes = {r.get("data-action"): r for r in root.iter(f"{SVG}rect") if r.get("data-action")}
    b0, f2 = boxes["0B0"], boxes["0F2"]
    assert float(b0.get("x")) + float(b0.get("width")) == pytest.approx(float(f2.get("x")))


def test_html_is_self_contained_with_tooltips(zb_h1):
    page = render_html(zb_h1)
    assert page.startswith("<!DOCTYPE html>") and "<svg" in page and "<script>" in page
    for external in ("src=", "href=", "@import", "url(", "http://www.w3.org/1999", "https:"):
        assert external not in page
    assert page.count('class="action ') == action_count(zb_h1)
    assert "d.duration" in page and 'data-duration="1"' in page


def test_png_has_the_png_signature(zb_h1):
    pytest.importorskip("cairosvg")
    from pipeforge.render.png import png_bytes

    data = png_bytes(zb_h1, scale=1.0)
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width = int.from_bytes(data[16:20], "big")
    assert width == int(float(ET.fromstring(render_svg(zb_h1)).get("width")))


def test_png_without_cairosvg_is_a_usage_error(zb_h1, monkeypatch, tmp_path):
    import builtins

    real_import = builtins.__import__

    def refuse_cairosvg(name, *args, **kwargs):
        if name == "cairosvg":
            raise ImportError("No module named 'cairosvg'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", refuse_cairosvg)
    from pipeforge.render.png import render_png

    with pytest.raises(UsageError, match=r"pipeforge\[png\]"):
        render_png(zb_h1, str(tmp_path / "x.png"))
    assert not (tmp_path / "x.png").exists()


def test_an_empty_timeline_still_renders():
    from pipeforge.ir import Schedule

    timeline = simulate(Schedule("empty", 2, 2, 0, (Placement.loop(2, 2),), ((), ())))
    assert render_text(timeline) == "(no compute actions)\n"
    root = ET.fromstring(render_svg(timeline))
    assert not [r for r in root.iter(f"{SVG}rect") if r.get("class", "").startswith("action")]
    assert "<svg" in render_html(timeline)


def test_ticks_do_not_drift():
    from pipeforge.render.grid import ticks

    assert ticks(0.3, 0.05) == [0.0, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3]
    assert ticks(1456.7, 200)[-1] == 1400


def test_grid_and_svg_goldens(goldens):
    timeline = simulate(one_f_one_b(4, 8), CostModel(F=1, I=1, W=1, comm=0.25))
    goldens.check("1f1b_4x8_comm.txt", render_text(timeline, width=100))
    goldens.check("1f1b_2x3.svg", render_svg(simulate(one_f_one_b(2, 3))))


orders = st.builds(random_consistent, seed=st.integers(0, 10_000), ranks=st.integers(1, 4), stages=st.just(4),
                   microbatches=st.integers(1, 5), split=st.booleans(), placement=st.sampled_from(["loop", "v"]))


@settings(max_examples=40, deadline=None)
@given(orders)
def test_every_picture_of_a_random_order_shows_every_action(schedule):
    from pipeforge.interop.chrome_trace import trace_events

    timeline = simulate(schedule, CostModel(F=1, I=1.5, W=0.5, comm=0.1))
    count = action_count(timeline)
    root = ET.fromstring(render_svg(timeline))
    assert len([r for r in root.iter(f"{SVG}rect") if r.get("class", "").startswith("action")]) == count
    assert len([e for e in trace_events(timeline) if e["ph"] == "X"]) == count
    rows = [line for line in render_text(timeline, width=60).splitlines() if line.startswith("rank")]
    assert len(rows) == schedule.ranks
