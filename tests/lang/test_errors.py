"""Every mistake in tests/lang/bad/ gives exit code 2 and the golden message (file:line:col, caret).

Driven through the command line: ``pipeforge fmt bad.pipe``. Regenerate the goldens
with ``pytest tests/lang --update-goldens`` after a deliberate change of wording.
"""

import subprocess
import sys
from pathlib import Path

import pytest

from pipeforge.cli import main

BAD = Path(__file__).parent / "bad"
PROGRAMS = Path(__file__).parent / "programs"


def run_cli(argv: list[str], capsys) -> tuple[int, str, str]:
    code = main(argv)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.mark.parametrize("name", sorted(p.stem for p in BAD.glob("*.pipe")))
def test_mistake_gives_the_golden_message(name, goldens, capsys, monkeypatch):
    monkeypatch.chdir(BAD)
    code, out, err = run_cli(["fmt", f"{name}.pipe"], capsys)
    assert (code, out) == (2, "")
    assert err.startswith(f"{name}.pipe:") and ": error: " in err
    goldens.check(f"{name}.txt", err)


DEFINE_CASES = {
    "unknown_define": ["-D", "Q=3"],
    "define_not_integer": ["-D", "P=four"],
    "define_breaks_require": ["-D", "M=2"],
    "define_zero_ranks": ["-D", "P=0"],
    "define_given_twice": ["-D", "P=2", "-D", "P=4"],  # (was: the last one silently won)
}


@pytest.mark.parametrize("name", list(DEFINE_CASES))
def test_bad_define_gives_the_golden_message(name, goldens, capsys, monkeypatch):
    monkeypatch.chdir(PROGRAMS)
    code, out, err = run_cli(["fmt", "one_f_one_b.pipe", *DEFINE_CASES[name]], capsys)
    assert (code, out) == (2, "")
    goldens.check(f"{name}.txt", err)


def test_defines_reach_the_schedule(capsys, monkeypatch):
    monkeypatch.chdir(PROGRAMS)
    code, out, _ = run_cli(["fmt", "one_f_one_b.pipe", "-D", "P=2", "-D", "M=2"], capsys)
    assert code == 0
    assert "schedule one_f_one_b(P = 2, M = 2) {" in out and "0F0 0F1 0B0 0B1" in out


def test_fmt_writes_the_output_file(tmp_path, capsys):
    out_file = tmp_path / "canonical.pipe"
    code, out, _ = run_cli(["fmt", str(PROGRAMS / "one_f_one_b.pipe"), "-o", str(out_file)], capsys)
    assert (code, out) == (0, "")
    assert out_file.read_text().startswith("schedule one_f_one_b(P = 4, M = 8) {")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["canonical.pipe"]


def test_fmt_leaves_no_file_on_error(tmp_path, capsys):
    out_file = tmp_path / "canonical.pipe"
    code, _, _ = run_cli(["fmt", str(BAD / "missing_brace.pipe"), "-o", str(out_file)], capsys)
    assert code == 2 and not any(tmp_path.iterdir())


def test_missing_file_exits_2(capsys, tmp_path):
    code, _, err = run_cli(["fmt", str(tmp_path / "absent.pipe")], capsys)
    assert code == 2 and "no such file" in err


def test_installed_command_exits_2_with_the_message(monkeypatch):
    result = subprocess.run([sys.executable, "-m", "pipeforge", "fmt", "missing_comma.pipe"], cwd=BAD,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert result.stderr.startswith("missing_comma.pipe:5:18: error: missing ','")
