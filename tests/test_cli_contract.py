"""The command-line contract under hostile input: exit codes, one-screen errors, JSON, no stray files.

Each case runs ``pipeforge.cli.main`` in-process in a scratch folder holding the
files below, and checks: the exit code; no traceback and a short stderr; with
``--json``, stdout empty or exactly one JSON object; and the named output not
created when the command fails.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest

from pipeforge import cli, library
from pipeforge.commands.exits import Exit

GOOD_PIPE = library.source_with_defaults("1f1b", {"P": 2, "M": 2})  # `ranks P` on line 3
INCONSISTENT_PIPE = """schedule bad(P = 2, M = 2) {
    ranks P
    stages P placement loop
    microbatches M
    rank r {
        for m in 0 .. M { B(r, m) F(r, m) }
    }
}
"""
FILES = {
    "good.pipe": GOOD_PIPE.encode(),
    "bad_order.pipe": INCONSISTENT_PIPE.encode(),
    "good.csv": b"0F0,0F1,0B0,0B1\n1F0,1B0,1F1,1B1\n",
    "empty.pipe": b"",
    "empty.csv": b"",
    "latin1.pipe": b"schedule x\xff\xfe\n",
    "latin1.csv": b"\xff\xfe,0F0\n",
    "binary.pipe": bytes(range(256)) * 4,
    "quoted.csv": b'"0F0","0B0"\n',
    "huge_mb.csv": b"0F99999999999999999999,0B99999999999999999999\n",
    "huge_stage.csv": b"99999999999999999999F0,99999999999999999999B0\n",
    "negative.csv": b"-1F0,-1B0\n",
    "commas.csv": b",,,\n,,\n",
}

# (argv, expected exit, output that must not appear, text stderr must hold)
CASES = [
    # unreadable or odd inputs, every command that reads one
    *[([cmd, name, *extra], 2, None, "") for cmd, extra in
      [("verify", []), ("simulate", []), ("fmt", []), ("convert", ["out.csv"]), ("show", ["-o", "out.svg"]),
       ("codegen", ["-o", "gen"]), ("optimize", ["-o", "out.pipe"])]
      for name in ("missing.pipe", "folder.pipe", "empty.pipe", "latin1.pipe", "binary.pipe", "latin1.csv")],
    (["verify", "missing.csv"], 2, None, "missing.csv"),
    (["verify", "empty.csv"], 2, None, "no rows"),
    (["verify", "quoted.csv"], 2, None, "quoted.csv:1:1"),
    (["verify", "negative.csv"], 2, None, "negative.csv:1:1"),
    (["verify", "commas.csv"], 2, None, "--stages"),
    # a huge index must fail fast, not hang building a billion-entry schedule
    (["verify", "huge_mb.csv"], 2, None, "at most"),
    (["verify", "huge_stage.csv", "--json"], 2, None, "at most"),
    (["convert", "huge_stage.csv", "out.pipe"], 2, "out.pipe", "at most"),
    (["verify", "good.csv", "--stages", "99999999999"], 2, None, "--stages"),
    (["simulate", "good.csv", "--microbatches", "99999999999"], 2, None, "--microbatches"),
    # -D
    (["verify", "good.pipe", "-D", "P"], 2, None, "NAME=VALUE"),
    (["verify", "good.pipe", "-D", "=3"], 2, None, "NAME=VALUE"),
    (["verify", "good.pipe", "-D", "P=abc"], 2, None, "integer"),
    (["verify", "good.pipe", "-D", "P=1e3"], 2, None, "integer"),
    (["verify", "good.pipe", "-D", "P=\u0663"], 2, None, "integer"),
    (["verify", "good.pipe", "-D", "P=-1"], 2, None, "good.pipe:3:"),
    (["verify", "good.pipe", "-D", "P=0"], 2, None, "good.pipe:3:"),
    (["verify", "good.pipe", "-D", "P=1000000000"], 2, None, "at most"),
    (["verify", "good.pipe", "-D", "Q=3"], 2, None, "'Q'"),
    (["verify", "good.pipe", "--schedule", "nope"], 2, None, "nope"),
    (["verify", "1f1b", "--schedule", "nope"], 2, None, "library schedule"),
    (["new", "1f1b", "-D", "Q=1", "-o", "new.pipe"], 2, "new.pipe", "'Q'"),
    (["new", "nope", "-o", "new.pipe"], 2, "new.pipe", "nope"),
    # --cost, --memory-limit, other numbers
    *[(["simulate", "good.pipe", "--cost", cost, "--json"], 2, None, "--cost")
      for cost in ("F=", "F=x", "G=1", "F=-1", "F=nan", "F=inf", "F=0,I=0,W=0,B=0")],
    *[([cmd, "good.pipe", "--memory-limit", limit, "--json"], 2, None, "--memory-limit")
      for cmd in ("verify", "simulate") for limit in ("-1", "0", "nan", "inf")],
    (["optimize", "good.pipe", "--memory-limit", "nan", "-o", "out.pipe"], 2, "out.pipe", "--memory-limit"),
    (["optimize", "good.pipe", "--time-limit", "nan", "-o", "out.pipe"], 2, "out.pipe", "--time-limit"),
    (["verify", "good.pipe", "--semantics", "bogus"], 2, None, "--semantics"),
    (["run", "good.pipe", "--nproc", "0"], 2, None, "--nproc 0: expected at least 1 process"),
    (["run", "good.pipe", "--nproc", "-3"], 2, None, "--nproc -3: expected at least 1 process"),
    (["run", "good.pipe", "--nproc", "100000"], 2, None, "--nproc"),
    (["run", "good.pipe", "--steps", "0"], 2, None, "--steps"),
    pytest.param(["run", "1f1b", "-D", "P=100000", "-D", "M=1", "--nproc", "100000"], 2, None, "--print-torchrun",
                 marks=pytest.mark.slow),
    (["run", "good.pipe", "--timeout", "0"], 2, None, "--timeout"),
    (["run", "good.pipe", "--timeout", "-1", "--json"], 2, None, "--timeout"),
    (["simulate", "good.pipe", "--width", "100000000"], 2, None, "--width"),
    (["show", "good.pipe", "--width", "100000000", "-o", "wide.png"], 2, "wide.png", "--width"),
    (["show", "good.pipe", "--width", "-3", "-o", "wide.svg"], 2, "wide.svg", "--width"),
    (["simulate", "good.pipe", "--width", "-1"], 2, None, "--width -1"),  # was clamped silently; show refused it
    # a value given twice: the last one silently won
    (["optimize", "good.pipe", "--cost", "F=1", "--cost", "F=2", "-o", "dup.pipe"], 2, "dup.pipe", "F is given twice"),
    (["show", "good.pipe", "-o", "a.svg", "-o", "b.svg"], 2, "b.svg", "-o/--output: given twice, first 'a.svg', then 'b.svg'"),
    (["codegen", "good.pipe", "-D", "M=2", "-D", "M=4", "-o", "gen"], 2, "gen", "M is given twice"),
    (["show", "1f1b", "-D", "P=1200", "-D", "M=1", "-o", "tall.png"], 2, "tall.png", "too large for a PNG"),
    # outputs: wrong extension, missing folder, a folder, a file where a folder should be
    (["new", "1f1b", "-o", "new.csv"], 2, "new.csv", ".pipe"),
    (["fmt", "good.pipe", "-o", "fmt.csv"], 2, "fmt.csv", ".pipe"),
    (["optimize", "good.pipe", "-o", "opt.csv"], 2, "opt.csv", ".pipe"),
    (["show", "good.pipe", "-o", "out.pdf"], 2, "out.pdf", ".svg"),
    (["convert", "good.pipe", "out.txt"], 2, "out.txt", ".csv"),
    (["new", "1f1b", "-o", "nodir/new.pipe"], 2, "nodir", "does not exist"),
    (["show", "good.pipe", "-o", "nodir/out.svg"], 2, "nodir", "does not exist"),
    (["convert", "good.pipe", "folder.pipe"], 2, None, "directory"),
    (["codegen", "good.pipe", "-o", "good.csv"], 2, None, "good.csv"),
    (["codegen", "good.pipe", "-o", "good.csv/sub", "--json"], 2, None, "good.csv"),
    # schedules that cannot run or cannot be written
    (["show", "bad_order.pipe", "-o", "bad.svg"], 1, "bad.svg", "stuck"),
    (["codegen", "bad_order.pipe", "-o", "gen", "--json"], 1, "gen", "order"),
    (["convert", "chimera", "chimera.csv"], 2, "chimera.csv", "chain"),
]


@pytest.fixture
def scratch(tmp_path: Path, monkeypatch) -> Path:
    for name, data in FILES.items():
        (tmp_path / name).write_bytes(data)
    (tmp_path / "folder.pipe").mkdir()
    monkeypatch.chdir(tmp_path)
    return tmp_path


def run_cli(argv: list[str], capsys) -> tuple[int, str, str]:
    try:
        code = cli.main(argv)
    except SystemExit as exit_:  # argparse's usage errors
        code = exit_.code
    out, err = capsys.readouterr()
    return code, out, err


def assert_contract(argv: list[str], code: int, out: str, err: str) -> None:
    assert "Traceback" not in err
    assert len(err.splitlines()) <= 25, err
    if "--json" in argv and out.strip():
        assert isinstance(json.loads(out), dict)


@pytest.mark.parametrize("argv, expected, absent, message", CASES, ids=lambda v: " ".join(v) if isinstance(v, list) else None)
def test_bad_input_is_refused_plainly(argv, expected, absent, message, scratch, capsys):
    started = time.process_time()  # CPU time: a hostile input must not make us work, whatever the machine's load
    code, out, err = run_cli(argv, capsys)
    assert code == expected, err
    assert_contract(argv, code, out, err)
    if "--json" in argv and out.strip():  # verify --json reports an error in the text as a JSON violation
        (violation,) = json.loads(out)["violations"]
        assert message in violation["message"] and violation["location"]
    else:
        assert message in err
        assert err.strip(), "an error must say something"
    if "--json" not in argv:
        assert not out.strip() or expected == 1, out
    if absent:
        assert not (scratch / absent).exists()
    assert time.process_time() - started < 20


@pytest.mark.parametrize("argv", [
    ["verify", "good.pipe", "--json"],
    ["verify", "good.csv", "--json"],
    ["verify", "bad_order.pipe", "--json"],
    ["simulate", "good.pipe", "--json"],
    ["simulate", "1f1b", "--json", "--cost", "F=1,I=1,W=1,comm=0.5"],
    ["codegen", "good.pipe", "-o", "gen", "--json"],
    ["optimize", "good.pipe", "-o", "opt.pipe", "--json", "--time-limit", "5"],
], ids=" ".join)
def test_json_is_one_object(argv, scratch, capsys):
    code, out, err = run_cli(argv, capsys)
    assert code in (0, 1), err
    assert "Traceback" not in err
    assert isinstance(json.loads(out), dict)


def test_a_mistyped_count_gives_a_short_report(scratch, capsys):
    """--stages 100000 on a 2-stage CSV: thousands of missing actions, reported briefly."""
    code, out, err = run_cli(["verify", "good.csv", "--stages", "100000", "--placement", "loop", "--json"], capsys)
    assert code == 1, err
    missing = [v["message"] for v in json.loads(out)["violations"] if v["kind"] == "missing"]
    assert len(missing) == 1001 and "more missing" in missing[-1]


def test_an_internal_error_is_a_reported_bug(scratch, capsys, monkeypatch):
    from pipeforge.commands import verify

    monkeypatch.setattr(verify, "run", lambda args: 1 // 0)
    code, out, err = run_cli(["verify", "good.pipe"], capsys)
    assert code == Exit.BUG == 70
    assert "ZeroDivisionError" in err and "bug in pipeforge" in err


def test_an_os_error_on_a_named_file_is_bad_input(scratch, capsys, monkeypatch):
    from pipeforge.commands import verify

    def refuse(args):
        raise PermissionError(13, "Permission denied", "good.pipe")

    monkeypatch.setattr(verify, "run", refuse)
    code, out, err = run_cli(["verify", "good.pipe"], capsys)
    assert code == 2
    assert "Permission denied" in err and "Traceback" not in err


def test_an_unwritable_output_leaves_no_file(scratch, capsys, monkeypatch):
    """Root ignores chmod, so make the rename fail the way a read-only folder would."""
    import os

    def refuse(src, dst):
        raise PermissionError(13, "Permission denied", src)

    monkeypatch.setattr(os, "replace", refuse)
    code, out, err = run_cli(["new", "1f1b", "-o", "new.pipe"], capsys)
    assert code == 2 and "cannot write 'new.pipe'" in err
    assert sorted(p.name for p in scratch.iterdir() if p.name.startswith(".new")) == []
    assert not (scratch / "new.pipe").exists()


@pytest.mark.skipif(shutil.which("true") is None, reason="needs a POSIX system")
def test_error_output_leaves_existing_file_untouched(scratch, capsys):
    (scratch / "kept.pipe").write_text("old\n")
    code, _, err = run_cli(["fmt", "binary.pipe", "-o", "kept.pipe"], capsys)
    assert code == 2 and "Traceback" not in err
    assert (scratch / "kept.pipe").read_text() == "old\n"


@pytest.mark.parametrize("argv, expected", [
    (["verify", "huge_mb.csv", "--json"], 2),
    (["convert", "binary.pipe", "out.csv"], 2),
    (["verify", "good.pipe", "--json"], 0),
], ids=lambda v: " ".join(v) if isinstance(v, list) else None)
def test_as_a_process(argv, expected, scratch):
    """The real entry point: exit status, stdout JSON only, stderr without a traceback."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "pipeforge", *argv], capture_output=True, text=True, timeout=60)
    assert done.returncode == expected, done.stderr
    assert "Traceback" not in done.stderr
    if "--json" in argv and done.stdout.strip():
        assert isinstance(json.loads(done.stdout), dict)
    assert not (scratch / "out.csv").exists()
