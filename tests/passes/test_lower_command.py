"""``pipeforge lower`` and the pass options of ``codegen`` and ``run``, through the command line."""

from __future__ import annotations

import json

import pytest

import pipeforge
from pipeforge.cli import main
from pipeforge.interop.torch_csv import read_csv_text, to_csv_text
from pipeforge.passes import PassOptions, apply_passes
from pipeforge.tools.generated import generated_text
from pipeforge.verifier import verify

SMALL = ["-D", "P=3", "-D", "M=4"]


@pytest.mark.parametrize("name, flags, options", [
    ("1f1b", [], PassOptions()),
    ("1f1b", ["--unshard", "1"], PassOptions(unshard=1)),
    ("interleaved-1f1b", ["--unshard", "2", "--reduce-grad"], PassOptions(unshard=2, reduce_grad=True)),
    ("zbv", ["--merge-bw"], PassOptions(merge_bw=True)),
    ("zbv", ["--merge-bw", "--unshard", "3", "--defer-recv"], PassOptions(unshard=3, merge_bw=True, defer_recv=True)),
    ("chimera", ["--unshard", "2"], PassOptions(unshard=2)),
])
def test_lower_prints_pipe_source_of_the_passes_output(name, flags, options, capsys):
    ranks = 4 if name == "chimera" else 3
    assert main(["lower", name, "-D", f"P={ranks}", "-D", "M=4", *flags]) == 0
    printed = pipeforge.loads(capsys.readouterr().out)
    expected = apply_passes(pipeforge.load(name, defines={"P": ranks, "M": 4}), options, lower=True)
    assert printed == expected
    assert printed.is_lowered
    assert verify(printed, semantics="buffered" if options.defer_recv else "rendezvous").valid


def test_lower_writes_torch_compute_comms_csv(tmp_path, capsys):
    out = tmp_path / "zbv.csv"
    assert main(["lower", "zbv", *SMALL, "--unshard", "2", "-o", str(out), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["output"] == str(out)
    expected = apply_passes(pipeforge.load("zbv", defines={"P": 3, "M": 4}), PassOptions(unshard=2), lower=True)
    text = out.read_bytes().decode()
    assert text == to_csv_text(expected, "compute_comms")
    assert "UNSHARD" in text and "RESHARD" in text and "REDUCE_GRAD" in text
    assert verify(read_csv_text(text, str(out)), semantics="buffered").valid


def test_lower_of_a_torch_csv_reads_and_writes_csv(tmp_path):
    source, out = tmp_path / "in.csv", tmp_path / "out.csv"
    source.write_text("0F0,0F1,0I0,0W0,0I1,0W1\n1F0,1I0,1W0,1F1,1I1,1W1\n")
    assert main(["lower", str(source), "--merge-bw", "-o", str(out)]) == 0
    assert out.read_text().splitlines() == [
        "0F0,0SEND_F0,0F1,0SEND_F1,0RECV_B0,0B0,0RECV_B1,0B1,0REDUCE_GRAD",
        "1RECV_F0,1F0,1RECV_F1,1B0,1SEND_B0,1F1,1B1,1SEND_B1,1REDUCE_GRAD",
    ]


@pytest.mark.parametrize("argv, says", [
    (["lower", "1f1b", "--unshard", "0"], "--unshard 0"),
    (["lower", "1f1b", "-o", "out.txt"], "must end in .pipe or .csv"),
    (["lower", "1f1b", "-o", "out"], "-o 'out': the output must end in .pipe or .csv (it has no suffix)"),
    (["show", "1f1b", "-o", "out"], "(it has no suffix)"),
    (["new", "1f1b", "-o", "out"], "-o 'out': the output is .pipe source and must end in .pipe (it has no suffix)"),
    (["lower", "1f1b", "--json"], "--json needs -o"),
    (["lower", "chimera", "-o", "out.csv"], "no chains"),
    (["codegen", "1f1b", "--unshard", "-1", "-o", "gen"], "--unshard -1"),
])
def test_bad_options_exit_2_and_write_nothing(argv, says, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    assert says in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_an_invalid_result_exits_1_and_writes_nothing(tmp_path, capsys):
    source, out = tmp_path / "bad.pipe", tmp_path / "out.pipe"
    source.write_text("schedule s { ranks 2 stages 2 placement loop microbatches 1\n"
                      "rank 0 { 0F0 0B0 1REDUCE_GRAD } rank 1 { 1F0 1B0 } }\n")
    assert main(["lower", str(source), "-o", str(out)]) == 1
    assert "placement" in capsys.readouterr().err
    assert not out.exists()


def test_a_schedule_that_already_unshards_is_refused(tmp_path, capsys):
    source = tmp_path / "sharded.pipe"
    source.write_text("schedule s { ranks 1 stages 1 placement loop microbatches 1\n"
                      "rank 0 { 0UNSHARD 0F0 0B0 0RESHARD } }\n")
    assert main(["lower", str(source), "--unshard", "2"]) == 2
    assert "already has 0UNSHARD" in capsys.readouterr().err


def test_codegen_applies_the_passes(tmp_path, capsys):
    assert main(["codegen", "zbv", *SMALL, "--no-locations", "-o", str(tmp_path / "plain")]) == 0
    assert main(["codegen", "zbv", *SMALL, "--merge-bw", "--no-locations", "-o", str(tmp_path / "merged")]) == 0
    plain, merged = (generated_text(tmp_path / folder / "zbv.py") for folder in ("plain", "merged"))
    assert plain.count(" backward(") == 0 < merged.count(" backward(")
    assert merged.count(" backward(") + merged.count(" backward_weight(") == plain.count(" backward_weight(")


def test_codegen_refuses_deferred_receives_without_the_flag_that_says_so(tmp_path, capsys):
    deferred = tmp_path / "deferred.csv"
    assert main(["lower", "1f1b", *SMALL, "--defer-recv", "-o", str(deferred)]) == 0
    # read back, the schedule is verified under rendezvous (the default), where it deadlocks
    assert main(["codegen", str(deferred), "-o", str(tmp_path / "out")]) == 1
    assert "deadlock" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_run_passes_the_pass_flags_to_torchrun(capsys):
    assert main(["run", "zbv", "-D", "P=2", "--unshard", "2", "--merge-bw", "--print-torchrun"]) == 0
    assert "--unshard 2 --merge-bw" in capsys.readouterr().out


@pytest.mark.distributed
@pytest.mark.timeout(600)
def test_run_with_merged_backwards_matches_the_unpipelined_model(capsys):
    assert main(["run", "zbv", "-D", "P=2", "-D", "M=4", "--merge-bw", "--json", "--timeout", "120"]) == 0
    assert json.loads(capsys.readouterr().out)["match"] is True


def test_a_torch_compute_comms_csv_is_verified_under_the_semantics_asked_for(tmp_path, capsys):
    source, out = tmp_path / "torch.csv", tmp_path / "out.csv"
    # torch's order: each cell posted alone; rank 0 sends both activations before receiving a gradient
    source.write_text("0F0,0SEND_F0,0F1,0SEND_F1,0RECV_B0,0B0,0RECV_B1,0B1\n"
                      "1RECV_F0,1F0,1B0,1SEND_B0,1RECV_F1,1F1,1B1,1SEND_B1\n")
    assert main(["lower", str(source), "--unshard", "1", "-o", str(out)]) == 1
    assert "deadlock" in capsys.readouterr().err and not out.exists()
    assert main(["lower", str(source), "--unshard", "1", "--semantics", "buffered", "-o", str(out)]) == 0
    assert out.read_text().splitlines()[0].startswith("0UNSHARD,0F0,0SEND_F0")
