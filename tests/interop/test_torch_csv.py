"""torch CSV: strict reading with spans, inference of the shape, writing back cell for cell."""

from __future__ import annotations

import csv
import io

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

import pipeforge.testing as pt
from pipeforge.commands import wording
from pipeforge.errors import ArgumentError, PipeforgeError, PipeSyntaxError, SemanticError, UsageError
from pipeforge.interop.torch_csv import has_communication, read_csv, read_csv_text, to_csv_text, write_csv
from pipeforge.ir import Action, ActionKind, Placement, Schedule, Step, parse_step
from tests.torch_stages import dump_torch_csv, read_cells


def cells_of(text: str) -> list[list[str]]:
    return list(csv.reader(io.StringIO(text, newline="")))


# ------------------------------------------------------------- reading

def test_reads_shape_placement_and_steps():
    schedule = read_csv_text("0F0,0F1,,0B0,0B1\n1F0,1B0,1F1,1B1\n", "pp.csv")
    assert (schedule.ranks, schedule.stages, schedule.microbatches) == (2, 2, 2)
    assert schedule.placement == Placement((0, 1))
    assert schedule.programs[0][2].is_idle
    assert schedule.programs[1][1] == Step((Action(1, ActionKind.B, 0),))
    assert schedule.name == "pp"


def test_overlap_cell_becomes_an_overlap_step():
    schedule = read_csv_text("0F0,1F0,(0F1;1B0)OVERLAP_F_B,1B1,0B0,0B1\n", "o.csv")
    step = schedule.programs[0][2]
    assert step.overlap and step == parse_step("(0F1;1B0)")


def test_runtime_actions_are_read():
    schedule = read_csv_text("0UNSHARD,0F0,0SEND_F0,0RECV_B0,0B0,0REDUCE_GRAD,0RESHARD\n"
                             "1RECV_F0,1F0,1B0,1SEND_B0\n", "c.csv")
    kinds = [step.actions[0].kind for step in schedule.programs[0]]
    assert kinds[0] is ActionKind.UNSHARD and kinds[5] is ActionKind.REDUCE_GRAD
    assert schedule.programs[0][2].is_group


@pytest.mark.parametrize("text, placement, style", [
    ("0F0\n1F0\n2F0\n3F0,7F0\n", None, None),
    ("0F0,4F0\n1F0,5F0\n2F0,6F0\n3F0,7F0\n", (0, 1, 2, 3, 0, 1, 2, 3), "loop"),
    ("0F0,7F0\n1F0,6F0\n2F0,5F0\n3F0,4F0\n", (0, 1, 2, 3, 3, 2, 1, 0), "v"),
    ("0F0,2F0\n1F0,3F0\n", (0, 1, 0, 1), "loop"),
    ("0F0,3F0\n1F0,2F0\n", (0, 1, 1, 0), "v"),
    ("1F0,3F0\n0F0,2F0\n", (1, 0, 1, 0), "explicit"),
])
def test_infers_placement(text, placement, style):
    if placement is None:
        with pytest.raises(SemanticError, match="stage 4 appears in no cell"):
            read_csv_text(text, "p.csv")
        return
    schedule = read_csv_text(text, "p.csv")
    assert schedule.placement.stage_to_rank == placement
    assert schedule.placement.style(schedule.ranks) == style


# (text, error class, rendered report) -- the exact messages a user sees
ERROR_CASES = [
    ("0F0,0BW3\n", PipeSyntaxError,
     "bad.csv:1:5: error: '0BW3' is not an action: expected STAGE KIND MICROBATCH, like '2F0' or '0SEND_F1'\n"
     "    0F0,0BW3\n"
     "        ^^^^"),
    ("0F0\n1F0,1F\n", PipeSyntaxError,
     "bad.csv:2:5: error: '1F' needs a microbatch index after 'F', like '1F0'\n"
     "    1F0,1F\n"
     "        ^^"),
    ("F0\n", PipeSyntaxError,
     "bad.csv:1:1: error: 'F0' is not an action: expected STAGE KIND MICROBATCH, like '2F0' or '0SEND_F1'\n"
     "    F0\n"
     "    ^^"),
    ("0F0,0F1x\n", PipeSyntaxError,
     "bad.csv:1:5: error: '0F1x' is not an action: expected STAGE KIND MICROBATCH, like '2F0' or '0SEND_F1'\n"
     "    0F0,0F1x\n"
     "        ^^^^"),
    ("0F0,(0F1;1B0)OVERLAP\n", PipeSyntaxError,
     "bad.csv:1:14: error: '(0F1;1B0)OVERLAP': expected 'OVERLAP_F_B' after ')', found 'OVERLAP'\n"
     "    0F0,(0F1;1B0)OVERLAP\n"
     "                 ^^^^^^^"),
    ("(0F1;1X0)OVERLAP_F_B\n", PipeSyntaxError,
     "bad.csv:1:6: error: '1X0' is not an action: expected STAGE KIND MICROBATCH, like '2F0' or '0SEND_F1'\n"
     "    (0F1;1X0)OVERLAP_F_B\n"
     "         ^^^"),
    ("0REDUCE_GRAD3\n", PipeSyntaxError,
     "bad.csv:1:1: error: '0REDUCE_GRAD3': REDUCE_GRAD takes no microbatch index\n"
     "    0REDUCE_GRAD3\n"
     "    ^^^^^^^^^^^^^"),
    ("0F0@1\n", PipeSyntaxError,
     "bad.csv:1:1: error: '0F0@1': torch CSV has no chains; write the action without '@'\n"
     "    0F0@1\n"
     "    ^^^^^"),
    ("0F0,1F0\n1F1\n", SemanticError,
     "bad.csv:2:1: error: stage 1 appears on two ranks: '1F0' on rank 0 at bad.csv:1:5 and '1F1' on rank 1 at "
     "bad.csv:2:1; a stage runs on one rank\n"
     "    1F1\n"
     "    ^^^\n"
     "note: first seen at bad.csv:1:5"),
]


@pytest.mark.parametrize("text, error, rendered", ERROR_CASES)
def test_errors_name_the_cell(text, error, rendered):
    with pytest.raises(error) as caught:
        read_csv_text(text, "bad.csv")
    assert caught.value.render() == rendered


def test_empty_file_is_an_error():
    with pytest.raises(SemanticError, match="holds no rows"):
        read_csv_text("", "empty.csv")


# ------------------------------------------------------------- stated shape

def test_stated_shape_is_checked_against_the_cells():
    text = "0F0,2F1\n1F0,3F1\n"
    schedule = read_csv_text(text, "s.csv", stages=4, microbatches=3, placement="loop")
    assert (schedule.stages, schedule.microbatches) == (4, 3)
    with pytest.raises(SemanticError) as caught:
        read_csv_text(text, "s.csv", stages=3)
    assert caught.value.render().startswith("s.csv:2:5: error: '3F1' names stage 3, but stages=3 allows 0..2")
    assert wording.render(caught.value).startswith("s.csv:2:5: error: '3F1' names stage 3, but --stages 3 allows")
    with pytest.raises(SemanticError, match=r"'2F1' names microbatch 1, but microbatches=1 allows 0..0"):
        read_csv_text(text, "s.csv", microbatches=1)
    with pytest.raises(SemanticError, match=r"'2F1' is on rank 0, but placement v puts stage 2 on rank 1"):
        read_csv_text(text, "s.csv", placement="v")
    with pytest.raises(ArgumentError, match="expected 'loop' or 'v'") as caught:
        read_csv_text(text, "s.csv", placement="zigzag")
    assert (caught.value.argument.keyword, caught.value.value) == ("placement", "zigzag")
    assert wording.message(caught.value).startswith("--placement 'zigzag': expected 'loop' or 'v'")


def test_stated_placement_fills_stages_without_cells():
    schedule = read_csv_text("0F0\n1F0\n", "s.csv", stages=4, placement="loop")
    assert schedule.placement == Placement((0, 1, 0, 1))


def test_missing_file_is_a_usage_error(tmp_path):
    with pytest.raises(UsageError, match="cannot read"):
        read_csv(tmp_path / "nope.csv")


# ------------------------------------------------------------- writing

def test_groups_become_consecutive_cells_and_compute_only_drops_them():
    schedule = read_csv_text("0F0,0SEND_F0,0RECV_B0,0B0,0REDUCE_GRAD\n1RECV_F0,1F0,1B0,1SEND_B0\n", "c.csv")
    grouped = schedule.programs[0][:1] + (parse_step("[0SEND_F0 0RECV_B0]"),) + schedule.programs[0][3:]
    schedule = Schedule(schedule.name, 2, 2, 1, schedule.placements, (grouped, schedule.programs[1]))
    assert cells_of(to_csv_text(schedule, "compute_comms"))[0] == ["0F0", "0SEND_F0", "0RECV_B0", "0B0", "0REDUCE_GRAD"]
    assert cells_of(to_csv_text(schedule, "compute_only")) == [["0F0", "0B0"], ["1F0", "1B0"]]


def test_compute_only_keeps_idle_cells_and_compute_comms_drops_them():
    schedule = read_csv_text("0F0,,0B0,\n1F0,1B0\n", "i.csv")
    assert to_csv_text(schedule, "compute_only") == "0F0,,0B0,\r\n1F0,1B0\r\n"


def test_chains_are_refused():
    placement = Placement((0, 1))
    program = (Step((Action(0, ActionKind.F, 0, chain=1),)),)
    schedule = Schedule("chimera", 2, 2, 1, (placement, Placement((1, 0))), (program, ()))
    with pytest.raises(PipeforgeError, match=r"torch CSV has no chains; '0F0@1' \(rank 0, step 0\)"):
        to_csv_text(schedule)


def test_unknown_format_is_a_usage_error():
    with pytest.raises(UsageError, match="format 'torch'"):
        to_csv_text(read_csv_text("0F0\n", "x.csv"), "torch")


def test_write_csv_is_atomic_and_leaves_nothing_on_error(tmp_path):
    target = tmp_path / "out.csv"
    write_csv(read_csv_text("0F0,0B0\n", "x.csv"), target)
    assert target.read_bytes() == b"0F0,0B0\r\n"
    chained = Schedule("c", 1, 1, 1, (Placement((0,)),), ((Step((Action(0, ActionKind.F, 0, 1),)),),))
    with pytest.raises(PipeforgeError):
        write_csv(chained, tmp_path / "never.csv")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.csv"]


# ------------------------------------------------------------- round trips

def compute_cell(stages):
    return st.builds(lambda s, k, m: f"{s}{k}{m}", st.sampled_from(stages), st.sampled_from("FBIW"), st.integers(0, 12))


def overlap_cell(stages):
    return st.lists(compute_cell(stages), min_size=1, max_size=3).map(lambda c: "(" + ";".join(c) + ")OVERLAP_F_B")


def comm_cell(stages):
    kinds = st.sampled_from(["SEND_F", "RECV_F", "SEND_B", "RECV_B"])
    return st.builds(lambda s, k, m: f"{s}{k}{m}", st.sampled_from(stages), kinds, st.integers(0, 12))


def stage_cell(stages):
    return st.builds(lambda s, k: f"{s}{k}", st.sampled_from(stages), st.sampled_from(["REDUCE_GRAD", "UNSHARD", "RESHARD"]))


@st.composite
def torch_rows(draw, cell_kinds):
    """Per-rank rows over a random placement; every stage appears, always on its own rank."""
    ranks = draw(st.integers(1, 4))
    owner = draw(st.lists(st.integers(0, ranks - 1), min_size=1, max_size=6))
    rows = []
    for rank in range(ranks):
        mine = [s for s, r in enumerate(owner) if r == rank]
        row = draw(st.lists(st.one_of(*(kind(mine) for kind in cell_kinds)), max_size=8)) if mine else []
        for stage in mine:
            row.insert(draw(st.integers(0, len(row))), draw(compute_cell([stage])))
        rows.append(row)
    return rows


def text_of(rows: list[list[str]]) -> str:
    out = io.StringIO()
    csv.writer(out).writerows(rows)
    return out.getvalue()


@settings(max_examples=150, deadline=None)
@given(torch_rows([compute_cell, overlap_cell, lambda _: st.just("")]))
def test_compute_only_round_trip(rows):
    text = text_of(rows)
    assert cells_of(to_csv_text(read_csv_text(text, "r.csv"), "compute_only")) == cells_of(text)


@settings(max_examples=150, deadline=None)
@given(torch_rows([compute_cell, overlap_cell, comm_cell, stage_cell]))
def test_compute_comms_round_trip(rows):
    text = text_of(rows)
    assume(any("SEND" in c or "RECV" in c for row in rows for c in row))
    assert to_csv_text(read_csv_text(text, "r.csv"), "compute_comms") == text


TORCH_SCHEDULES = [
    ("Schedule1F1B", 4, 8, 1), ("ScheduleGPipe", 4, 8, 1),
    ("ScheduleInterleaved1F1B", 4, 8, 2), ("ScheduleLoopedBFS", 4, 8, 2),
    ("ScheduleInterleavedZeroBubble", 4, 8, 2), ("ScheduleZBVZeroBubble", 4, 8, 2),
    ("ScheduleDualPipeV", 4, 10, 2),
]


@pytest.mark.parametrize("name, ranks, microbatches, per_rank", TORCH_SCHEDULES)
@pytest.mark.parametrize("form", ["compute_only", "compute_comms"])
def test_torch_dumps_round_trip_byte_for_byte(tmp_path, name, ranks, microbatches, per_rank, form):
    if per_rank == 1 and form == "compute_comms":
        pytest.skip("single-stage schedules have no lowered order")
    path = dump_torch_csv(name, ranks, microbatches, per_rank, tmp_path / "t.csv", form)
    schedule = read_csv(path)
    assert schedule.ranks == ranks and schedule.stages == ranks * per_rank
    assert cells_of(to_csv_text(schedule, form)) == read_cells(path)
    assert to_csv_text(schedule, form) == path.read_bytes().decode()


def flattened(programs) -> list[list[str]]:
    """Each program as one token per action (torch writes a group as consecutive cells)."""
    return [[str(a) if not step.overlap else str(step) for step in program
             for a in (step.actions if not step.overlap else step.actions[:1])] for program in programs]


@settings(max_examples=60, deadline=None)
@given(pt.schedules(max_ranks=4, comms="random"))
def test_drawn_schedules_survive_csv(schedule):
    from pipeforge.passes.lower import lower

    talks = has_communication(schedule)
    comms = read_csv_text(to_csv_text(schedule, "compute_comms"), "drawn.csv")
    assert (comms.stages, comms.microbatches, comms.placement) == (schedule.stages, schedule.microbatches,
                                                                    schedule.placement)
    assert flattened(comms.programs) == flattened((schedule if talks else lower(schedule)).programs)
    compute = read_csv_text(to_csv_text(schedule, "compute_only"), "drawn.csv")
    assert compute.programs == (schedule.compute_only() if talks else schedule).programs
