"""``pipeforge verify``: exit codes 0/1/2, the JSON contract, carets and the deadlock cycle."""

from __future__ import annotations

import json

import pytest

from pipeforge import library
from pipeforge.cli import main

ONE_F_ONE_B = library.source("1f1b")  # P = 4, M = 8

CYCLE = """\
schedule loop_cycle() {
    ranks 2
    stages 4 placement loop
    microbatches 1
    rank 0 { F(0, 0) F(2, 0) B(2, 0) B(0, 0) }
    rank 1 { F(3, 0) F(1, 0) B(3, 0) B(1, 0) }
}
"""

FACING = """\
schedule facing() {
    ranks 2
    stages 2 placement loop
    microbatches 2
    rank 0 { 0F0 0F1 0SEND_F0 0SEND_F1 0RECV_B0 0B0 0RECV_B1 0B1 }
    rank 1 { 1RECV_F0 1F0 1B0 1SEND_B0 1RECV_F1 1F1 1B1 1SEND_B1 }
}
"""


@pytest.fixture
def write(tmp_path):
    def write_file(name: str, text: str) -> str:
        path = tmp_path / name
        path.write_text(text, encoding="utf-8")
        return str(path)
    return write_file


def test_a_valid_schedule_exits_0_with_the_certificate_line(write, capsys):
    assert main(["verify", write("a.pipe", ONE_F_ONE_B)]) == 0
    assert capsys.readouterr().out.startswith("valid: decided by z3 (free start times) (")


def test_parameters_reach_the_schedule(write, capsys):
    assert main(["verify", write("a.pipe", ONE_F_ONE_B), "-D", "P=2", "-D", "M=3", "--json"]) == 0
    stats = json.loads(capsys.readouterr().out)["stats"]
    assert (stats["ranks"], stats["microbatches"]) == (2, 3)


def test_a_deadlock_exits_1_and_names_each_hop_with_its_location(write, capsys):
    path = write("cycle.pipe", CYCLE)
    assert main(["verify", path]) == 1
    out = capsys.readouterr().out
    assert f"{path}:5:22: deadlock: rank 0 step 1 (2F0) waits for 1SEND_F0 from rank 1, " \
           "which waits at step 0 (3F0) for 2SEND_F0 from rank 0" in out
    assert "rank 0 { F(0, 0) F(2, 0) B(2, 0) B(0, 0) }" in out and "^^^^^^^" in out
    assert f"rank 1 step 0 (3F0) at {path}:6:14 waits for 2SEND_F0 from rank 0" in out
    assert "Step 1: 2F0*" in out


def test_json_output_is_one_object_with_the_contract_keys(write, capsys):
    assert main(["verify", write("cycle.pipe", CYCLE), "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["valid"] is False
    assert list(report["stats"]) == ["ranks", "stages", "microbatches", "actions", "seconds"]
    (violation,) = report["violations"]
    assert list(violation) == ["kind", "message", "rank", "step", "location"]
    assert (violation["kind"], violation["rank"], violation["step"]) == ("deadlock", 0, 1)
    assert violation["location"].endswith("cycle.pipe:5:22")


def test_semantics_flag_picks_buffered(write, capsys):
    path = write("facing.pipe", FACING)
    assert main(["verify", path]) == 1
    assert main(["verify", path, "--semantics", "buffered"]) == 0


def test_memory_limit_flag(write, capsys):
    path = write("a.pipe", ONE_F_ONE_B)
    assert main(["verify", path, "--memory-limit", "4"]) == 0
    assert main(["verify", path, "--memory-limit", "3"]) == 1
    assert "memory: rank 0 holds 4 microbatches of activations" in capsys.readouterr().out


def test_memory_limit_flag_json(write, capsys):
    path = write("a.pipe", ONE_F_ONE_B)
    assert main(["verify", path, "--memory-limit", "3", "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert {v["kind"] for v in report["violations"]} == {"memory"}
    assert [v["rank"] for v in report["violations"]] == [0]


def test_a_syntax_error_exits_2_with_a_caret(write, capsys):
    path = write("bad.pipe", "schedule x( {\n")
    assert main(["verify", path]) == 2
    err = capsys.readouterr().err
    assert f"{path}:1:13" in err and "^" in err


def test_a_syntax_error_in_json_mode_is_a_syntax_violation_and_exit_2(write, capsys):
    path = write("bad.pipe", "schedule x( {\n")
    assert main(["verify", path, "--json"]) == 2
    report = json.loads(capsys.readouterr().out)
    assert report["valid"] is False
    (violation,) = report["violations"]
    assert violation["kind"] == "syntax" and violation["location"] == f"{path}:1:13"


def test_an_elaboration_error_in_json_mode_is_a_located_syntax_violation(write, capsys):
    path = write("range.pipe", "schedule x {\n ranks 1\n stages 1 placement loop\n microbatches 2\n"
                               " rank 0 { F(0, 5) }\n}\n")
    assert main(["verify", path, "--json"]) == 2
    (violation,) = json.loads(capsys.readouterr().out)["violations"]
    assert violation["kind"] == "syntax" and violation["location"].startswith(f"{path}:5:")
    assert "microbatch" in violation["message"]


def test_a_missing_file_is_bad_input(capsys):
    assert main(["verify", "no/such/file.pipe"]) == 2


def test_torch_csv_of_the_buggy_1f1b_is_invalid_and_interleaved_is_valid(tmp_path, capsys):
    from tests import torch_stages
    buggy = torch_stages.dump_torch_csv("Schedule1F1B", 4, 8, 1, tmp_path / "1f1b.csv")
    assert main(["verify", str(buggy), "--json"]) == 1
    kinds = {v["kind"] for v in json.loads(capsys.readouterr().out)["violations"]}
    assert "missing" in kinds  # its pipeline_order never forwards microbatch 0 on the last rank (step() does)
    good = torch_stages.dump_torch_csv("ScheduleInterleaved1F1B", 4, 8, 2, tmp_path / "i1f1b.csv")
    assert main(["verify", str(good)]) == 0
    comms = torch_stages.dump_torch_csv("ScheduleInterleaved1F1B", 4, 8, 2, tmp_path / "c.csv", "compute_comms")
    assert main(["verify", str(comms), "--semantics", "buffered"]) == 0


GROUP_MEETS_TWO = """
schedule g {
    ranks 2
    stages 2 placement loop
    microbatches 1
    rank 0 { 0F0 [0SEND_F0 0RECV_B0] 0B0 }
    rank 1 { 1RECV_F0 1F0 1B0 1SEND_B0 }
}
"""


def test_semantics_nccl_and_solve_flags(write, capsys):
    path = write("g.pipe", GROUP_MEETS_TWO)
    assert main(["verify", path]) == 1  # rendezvous: rank 0's group meets two groups of rank 1
    capsys.readouterr()
    assert main(["verify", path, "--semantics", "nccl", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["valid"] and report["semantics"] == "nccl" and report["solved"]
    assert main(["verify", path, "--semantics", "nccl", "--no-solve", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert not report["solved"] and report["established"]["deadlock"].startswith("event pass")


def test_a_disagreement_between_z3_and_the_event_pass_exits_70(write, monkeypatch, capsys):
    """Fault injection: an event pass that finds no wait cycle in a deadlocked schedule."""
    import pipeforge.verifier as verify_package
    from pipeforge.verifier.events import Timing

    def blind(program, pairing, semantics):
        return Timing(tuple(tuple(range(len(row))) for row in program.slots),
                      tuple(tuple(1 for _ in row) for row in program.slots))

    monkeypatch.setattr(verify_package, "run", blind)
    path = write("g.pipe", GROUP_MEETS_TWO)
    assert main(["verify", path, "--solve"]) == 70
    assert "VerifierDisagreement" in capsys.readouterr().err
