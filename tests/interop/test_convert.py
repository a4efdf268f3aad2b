"""``pipeforge convert`` through the command line, on CSVs torch itself wrote."""

from __future__ import annotations

import json

import pytest

from pipeforge.cli import main
from pipeforge.interop.torch_csv import read_csv
from tests.torch_stages import build_torch_schedule, dump_torch_csv, read_cells


@pytest.fixture(params=["compute_only", "compute_comms"])
def dualpipev(request, tmp_path):
    """torch 2.13's ScheduleDualPipeV, 4 ranks, 10 microbatches, dumped by torch's _dump_csv."""
    return request.param, dump_torch_csv("ScheduleDualPipeV", 4, 10, 2, tmp_path / "dualpipev.csv", request.param)


def test_dualpipev_csv_to_csv_keeps_every_cell(dualpipev, tmp_path):
    form, source = dualpipev
    out = tmp_path / "out.csv"
    assert main(["convert", str(source), str(out)]) == 0
    torch_cells = read_cells(source)
    assert read_cells(out) == torch_cells
    assert any(cell.endswith(")OVERLAP_F_B") for row in torch_cells for cell in row)
    assert (form == "compute_comms") == any("SEND_F" in cell for row in torch_cells for cell in row)
    assert main(["convert", str(source), str(out), "--format", form, "--placement", "v"]) == 0
    assert read_cells(out) == torch_cells


def test_dualpipev_comms_to_compute_only_is_torchs_compute_only(tmp_path):
    comms = dump_torch_csv("ScheduleDualPipeV", 4, 10, 2, tmp_path / "comms.csv", "compute_comms")
    compute = dump_torch_csv("ScheduleDualPipeV", 4, 10, 2, tmp_path / "compute.csv", "compute_only")
    out = tmp_path / "out.csv"
    assert main(["convert", str(comms), str(out), "--format", "compute_only"]) == 0
    assert read_cells(out) == read_cells(compute)


def test_dualpipev_through_pipe_and_back(dualpipev, tmp_path):
    form, source = dualpipev
    pipe, back = tmp_path / "dualpipev.pipe", tmp_path / "back.csv"
    assert main(["convert", str(source), str(pipe)]) == 0
    assert main(["convert", str(pipe), str(back), "--format", form]) == 0
    assert read_cells(back) == read_cells(source)


def test_csv_to_chrome_trace(dualpipev, tmp_path):
    _, source = dualpipev
    out = tmp_path / "trace.json"
    assert main(["convert", str(source), str(out)]) == 0
    assert json.loads(out.read_text())


@pytest.mark.parametrize("args, message", [
    (["out.txt"], "the output must end in .csv, .pipe or .json, not '.txt'"),
    (["out"], "the output must end in .csv, .pipe or .json (it has no suffix)"),
    (["out.pipe", "--format", "compute_only"], "--format applies to a .csv output, not '.pipe'"),
    (["out.csv", "--placement", "loop"], "'2F0' is on rank 1, but placement loop puts stage 2 on rank 0"),
    (["out.csv", "--stages", "2"], "'2F0' names stage 2, but --stages 2 allows 0..1"),
    (["out.csv", "-D", "P=4"], "-D and --schedule apply to .pipe files, not to a torch CSV"),
])
def test_bad_requests_exit_2_and_write_nothing(tmp_path, capsys, args, message):
    source = tmp_path / "in.csv"
    source.write_text("0F0,0B0\n1F0,2F0,2B0,1B0\n")
    out = tmp_path / args[0]
    assert main(["convert", str(source), str(out), *args[1:]]) == 2
    assert message in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.csv"]


def test_malformed_cell_exits_2_with_a_caret(tmp_path, capsys):
    source = tmp_path / "bad.csv"
    source.write_text("0F0,0B0\n1F0,1BW0\n")
    out = tmp_path / "out.csv"
    out.write_text("previous contents\n")
    assert main(["convert", str(source), str(out)]) == 2
    err = capsys.readouterr().err
    assert f"{source}:2:5: error: '1BW0' is not an action" in err
    assert "    1F0,1BW0\n        ^^^^" in err
    assert out.read_text() == "previous contents\n"


@pytest.mark.parametrize("library, torch_class", [
    ("interleaved-1f1b", "ScheduleInterleaved1F1B"), ("looped-bfs", "ScheduleLoopedBFS"),
    ("zbv", "ScheduleZBVZeroBubble"), ("dualpipev", "ScheduleDualPipeV"),
])
@pytest.mark.parametrize("form", ["compute_only", "compute_comms"])
def test_torch_loads_what_we_write(tmp_path, library, torch_class, form):
    """A library schedule exported to CSV passes torch's own _load_csv (parse, validation, lowering)."""
    out = tmp_path / f"{library}.csv"
    assert main(["convert", library, str(out), "--format", form]) == 0
    torch_schedule = build_torch_schedule(torch_class, 4, 8, 2)
    torch_schedule._load_csv(str(out), format=form)
    loaded = torch_schedule.pipeline_order if form == "compute_only" else torch_schedule.pipeline_order_with_comms
    assert [["" if a is None else str(a) for a in loaded[rank]] for rank in sorted(loaded)] == read_cells(out)


def test_bidirectional_library_schedule_is_refused(tmp_path, capsys):
    out = tmp_path / "chimera.csv"
    assert main(["convert", "chimera", str(out)]) == 2
    err = capsys.readouterr().err
    assert "error: torch CSV has no chains; '" in err and "belongs to chain 1 of the bidirectional schedule" in err
    assert not out.exists()


@pytest.mark.parametrize("library", ["1f1b", "gpipe", "interleaved-1f1b", "interleaved-zb", "looped-bfs",
                                     "zb-h1", "zb-h2", "zbv", "v-min", "dualpipev"])
def test_exported_communication_reads_back_valid(tmp_path, library):
    """torch has no groups: lowered groups become consecutive cells, and must still verify one op at a time."""
    from pipeforge.verifier import verify

    out = tmp_path / f"{library}.csv"
    assert main(["convert", library, str(out), "--format", "compute_comms"]) == 0
    for semantics in ("rendezvous", "buffered"):
        report = verify(read_csv(out), semantics=semantics)
        assert report.valid, [v.message for v in report.violations]
