"""Hostile input through the real command line: every command that reads or writes a file.

Each case runs ``python -m pipeforge`` as a process under an address-space cap
(``prlimit --as``) and a wall-clock limit, and checks what issue 24 asks of bad
input: exit 2 with a message naming the problem, no traceback, no escape byte in
what it prints, nothing half-written (no temporary file left, no existing file
changed). The inputs: devices, FIFOs with no writer, symlink loops, folders,
missing and unreadable files, files past the size limit; outputs that are
FIFOs, devices, folders, inside read-only folders, or the input itself.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MEMORY_CAP = 2 << 30  # bytes of address space: /dev/zero read whole once took more than this
WALL = 90  # seconds; each case takes about one second alone (a hang is what this catches)
IS_ROOT = hasattr(os, "geteuid") and os.geteuid() == 0

SMALL = """\
schedule tiny(P = 2, M = 2) {
    ranks P
    stages P placement loop
    microbatches M
    rank r {
        for m in 0 .. M { F(r, m) }
        for m in 0 .. M { B(r, m) }
    }
}
"""


def pipeforge(argv: list[str], cwd: Path, *, stdout=subprocess.PIPE, cap: int = MEMORY_CAP,
              timeout: float = WALL) -> subprocess.CompletedProcess:
    """``python -m pipeforge ARGV`` in ``cwd`` under ``prlimit --as=cap`` (setrlimit where prlimit is absent)."""
    command = [sys.executable, "-m", "pipeforge", *argv]
    prlimit = shutil.which("prlimit")
    preexec = None
    if prlimit:
        command = [prlimit, f"--as={cap}", *command]
    else:
        import resource

        def preexec():
            resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (str(ROOT), os.environ.get("PYTHONPATH"))))}
    return subprocess.run(command, cwd=cwd, stdout=stdout, stderr=subprocess.PIPE, timeout=timeout, env=env,
                          preexec_fn=preexec)


def assert_refused(done: subprocess.CompletedProcess, message: str, code: int = 2) -> str:
    """The checks of a refusal; its stderr."""
    out = done.stdout or b""
    err = done.stderr.decode("utf-8", "replace")
    assert done.returncode == code, err
    assert "Traceback" not in err and "bug in pipeforge" not in err, err
    assert b"\x1b" not in out and b"\x1b" not in done.stderr, err
    assert message in err, err
    return err


def snapshot(folder: Path) -> dict[str, bytes]:
    """Every regular file under ``folder`` (not following links) with its bytes."""
    files = {}
    for path in folder.rglob("*"):
        if path.is_symlink() or not path.is_file():
            continue
        try:
            files[str(path.relative_to(folder))] = path.read_bytes()
        except OSError:
            files[str(path.relative_to(folder))] = b"<unreadable>"
    return files


@pytest.fixture
def scratch(tmp_path: Path) -> Path:
    (tmp_path / "small.pipe").write_text(SMALL)
    (tmp_path / "small.csv").write_text("0F0,0F1,0B0,0B1\n")
    (tmp_path / "costs.json").write_text('{"stages": [{"F": 1, "I": 1, "W": 1}, {"F": 1, "I": 1, "W": 1}]}\n')
    (tmp_path / "zero.csv").symlink_to("/dev/zero")
    (tmp_path / "zero.pipe").symlink_to("/dev/zero")
    os.mkfifo(tmp_path / "fifo.pipe")
    os.mkfifo(tmp_path / "fifo.csv")
    os.mkfifo(tmp_path / "fifo.json")
    (tmp_path / "loop_a.pipe").symlink_to("loop_b.pipe")
    (tmp_path / "loop_b.pipe").symlink_to("loop_a.pipe")
    (tmp_path / "folder.pipe").mkdir()
    (tmp_path / "folder.csv").mkdir()
    with open(tmp_path / "big.pipe", "wb") as big:  # sparse: past the limit without using the disk
        big.truncate(33 << 20)
    with open(tmp_path / "big.json", "wb") as big:
        big.truncate(5 << 20)
    (tmp_path / "devnull.pipe").symlink_to("/dev/null")
    (tmp_path / "notes.pipe").write_text("my notes, not a schedule\n")
    return tmp_path


# Every command that reads a schedule, with the rest of a command line that is otherwise right.
READERS = {
    "verify": lambda path: ["verify", path],
    "fmt": lambda path: ["fmt", path],
    "convert": lambda path: ["convert", path, "out.csv"],
    "lower": lambda path: ["lower", path, "-o", "out.pipe"],
    "simulate": lambda path: ["simulate", path],
    "show": lambda path: ["show", path, "-o", "out.svg"],
    "optimize": lambda path: ["optimize", path, "-o", "out.pipe", "--time-limit", "5"],
    "codegen": lambda path: ["codegen", path, "-o", "out.py"],
    "run": lambda path: ["run", path, "--steps", "1"],
}

BAD_INPUTS = {
    "/dev/zero": "is a character device",
    "zero.csv": "is a character device",
    "zero.pipe": "is a character device",
    "fifo.pipe": "is a FIFO",
    "fifo.csv": "is a FIFO",
    "loop_a.pipe": "Too many levels of symbolic links",
    "folder.pipe": "is a directory",
    "folder.csv": "is a directory",
    "missing.pipe": "no such file",
    "big.pipe": "may hold at most 32 MiB",
}


@pytest.mark.parametrize("path", sorted(BAD_INPUTS))
@pytest.mark.parametrize("command", sorted(READERS))
def test_a_bad_input_file_is_refused_before_it_is_read(command, path, scratch):
    before = snapshot(scratch)
    done = pipeforge(READERS[command](path), scratch)
    assert_refused(done, BAD_INPUTS[path])
    assert snapshot(scratch) == before  # no output, no temporary file


@pytest.mark.parametrize("path, message", [
    ("/dev/zero", "is a character device"), ("fifo.json", "is a FIFO"), ("folder.pipe", "is a directory"),
    ("big.json", "may hold at most 4 MiB"), ("missing.json", "no such file"),
])
@pytest.mark.parametrize("command", ["simulate", "optimize"])
def test_a_bad_cost_file_is_refused(command, path, message, scratch):
    argv = ["simulate", "small.pipe", "--costs", path] if command == "simulate" else \
        ["optimize", "small.pipe", "--costs", path, "-o", "out.pipe", "--time-limit", "5"]
    assert_refused(pipeforge(argv, scratch), message)
    assert not (scratch / "out.pipe").exists()


@pytest.mark.skipif(IS_ROOT, reason="root reads a file whatever its mode")
@pytest.mark.parametrize("command", sorted(READERS))
def test_an_unreadable_file_is_refused(command, scratch):
    (scratch / "secret.pipe").write_text(SMALL)
    (scratch / "secret.pipe").chmod(0)
    assert_refused(pipeforge(READERS[command]("secret.pipe"), scratch), "Permission denied")


# Every command that writes a file, writing to OUT.
WRITERS = {
    "fmt": lambda out: ["fmt", "small.pipe", "-o", out],
    "lower": lambda out: ["lower", "small.pipe", "-o", out],
    "convert": lambda out: ["convert", "small.pipe", out],
    "new": lambda out: ["new", "1f1b", "-o", out],
    "optimize": lambda out: ["optimize", "small.pipe", "-o", out, "--time-limit", "5"],
    "show": lambda out: ["show", "small.pipe", "-o", out],
    "codegen": lambda out: ["codegen", "small.pipe", "-o", out],
}
SUFFIX = {"fmt": ".pipe", "lower": ".pipe", "convert": ".pipe", "new": ".pipe", "optimize": ".pipe", "show": ".svg",
          "codegen": ".py"}


@pytest.mark.parametrize("command", sorted(WRITERS))
def test_an_output_that_is_a_fifo_is_refused_not_opened(command, scratch):
    os.mkfifo(scratch / f"sink{SUFFIX[command]}")
    done = pipeforge(WRITERS[command](f"sink{SUFFIX[command]}"), scratch)
    assert_refused(done, "FIFO")
    assert (scratch / f"sink{SUFFIX[command]}").is_fifo()


@pytest.mark.parametrize("command", sorted(WRITERS))
def test_an_output_that_links_to_a_device_is_refused_and_the_link_kept(command, scratch):
    out = f"dev{SUFFIX[command]}"
    (scratch / out).symlink_to("/dev/null")
    before = snapshot(scratch)
    assert_refused(pipeforge(WRITERS[command](out), scratch), "character device")
    assert os.readlink(scratch / out) == "/dev/null" and snapshot(scratch) == before


@pytest.mark.parametrize("command", sorted(WRITERS))
def test_an_output_that_is_a_folder_is_refused(command, scratch):
    out = f"box{SUFFIX[command]}"
    (scratch / out).mkdir()
    assert_refused(pipeforge(WRITERS[command](out), scratch), "directory")


@pytest.mark.parametrize("command", sorted(WRITERS))
def test_an_output_inside_a_read_only_folder_is_refused(command, scratch):
    if IS_ROOT:  # root writes into a folder whatever its mode; sysfs refuses even root a new file
        if not Path("/sys").is_dir() or os.access("/sys", os.W_OK) and _can_create("/sys"):
            pytest.skip("no folder here that root cannot write into")
        out = f"/sys/pipeforge_hostile{SUFFIX[command]}"
    else:
        (scratch / "locked").mkdir()
        out = f"locked/out{SUFFIX[command]}"
        (scratch / "locked").chmod(0o555)
    done = pipeforge(WRITERS[command](out), scratch)
    assert_refused(done, "cannot write")
    assert not Path(scratch / out).exists()


def _can_create(folder: str) -> bool:
    probe = Path(folder) / ".pipeforge-probe"
    try:
        probe.touch()
    except OSError:
        return False
    probe.unlink()
    return True


@pytest.mark.parametrize("argv", [
    ["fmt", "small.pipe", "-o", "small.pipe"],
    ["lower", "small.pipe", "-o", "small.pipe"],
    ["convert", "small.pipe", "small.pipe"],
    ["convert", "small.csv", "small.csv"],
    ["optimize", "small.pipe", "-o", "small.pipe", "--time-limit", "5"],
    ["fmt", "link.pipe", "-o", "small.pipe"],
], ids=" ".join)
def test_the_output_equal_to_the_input_is_refused(argv, scratch):
    (scratch / "link.pipe").symlink_to("small.pipe")
    before = snapshot(scratch)
    assert_refused(pipeforge(argv, scratch), "is the input")
    assert snapshot(scratch) == before


def test_new_replaces_an_unrelated_file_only_with_force(scratch):
    before = (scratch / "notes.pipe").read_text()
    assert_refused(pipeforge(["new", "1f1b", "-o", "notes.pipe"], scratch), "--force")
    assert (scratch / "notes.pipe").read_text() == before
    assert pipeforge(["new", "1f1b", "-o", "notes.pipe", "--force"], scratch).returncode == 0
    assert "schedule one_f_one_b" in (scratch / "notes.pipe").read_text()


def test_new_replaces_the_same_schedules_source_and_refuses_another_schedules(scratch):
    assert pipeforge(["new", "1f1b", "-o", "mine.pipe"], scratch).returncode == 0
    assert pipeforge(["new", "1f1b", "-D", "P=8", "-o", "mine.pipe"], scratch).returncode == 0
    assert "P = 8" in (scratch / "mine.pipe").read_text()
    assert_refused(pipeforge(["new", "gpipe", "-o", "mine.pipe"], scratch), "holds schedule 'one_f_one_b'")


def test_a_full_device_on_stdout_is_a_clear_error(scratch):
    with open("/dev/full", "wb") as full:
        done = pipeforge(["library"], scratch, stdout=full)
    assert_refused(done, "cannot write the output: No space left on device")


@pytest.mark.parametrize("argv", [["library"], ["fmt", "1f1b", "-D", "P=16", "-D", "M=64"],
                                  ["verify", "1f1b", "--json"]], ids=" ".join)
def test_a_closed_pipe_on_stdout_is_a_silent_usual_exit(argv, scratch):
    read, write = os.pipe()
    os.close(read)  # `| head -0`: the reader has gone before anything is written
    try:
        done = pipeforge(argv, scratch, stdout=write)
    finally:
        os.close(write)
    assert done.returncode == 0, done.stderr
    assert done.stderr == b""


def test_codegen_judges_a_deeply_nested_file_at_the_output_without_parsing_it_whole(scratch):
    deep = scratch / "deep.py"
    deep.write_text("x = " + "-" * 3_000_000 + "1\n" + "y = " + "(" * 100_000 + "1" + ")" * 100_000 + "\n")
    before = deep.read_bytes()
    done = pipeforge(["codegen", "small.pipe", "-o", "deep.py"], scratch, cap=1 << 30)
    assert_refused(done, "is not a module pipeforge wrote")
    assert deep.read_bytes() == before


def test_two_codegen_runs_to_one_output_never_both_succeed(scratch):
    """Different schedules written to one module at once: one wins, the other is refused (a folder lock)."""
    for round_ in range(4):
        (scratch / "race.py").unlink(missing_ok=True)
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        runs = [subprocess.Popen([sys.executable, "-m", "pipeforge", "codegen", name, "-o", "race.py"], cwd=scratch,
                                 stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
                for name in ("1f1b", "gpipe")]
        codes = [run.wait(timeout=WALL) for run in runs]
        errors = [run.stderr.read().decode() for run in runs]
        for run in runs:
            run.stderr.close()
        assert sorted(codes) == [0, 2], (round_, codes, errors)
        loser = errors[codes.index(2)]
        assert "holds the module of schedule" in loser and "Traceback" not in loser
        assert not list(scratch.glob(".race.py.*"))


@pytest.mark.parametrize("path, message", [
    ("/dev/zero", "is a character device"), ("fifo.py", "is a FIFO"), ("folder.pipe", "is a directory"),
    ("missing.py", "no such file"), ("loop_a.pipe", "Too many levels of symbolic links"),
])
def test_profile_refuses_a_model_path_that_is_not_a_regular_file(path, message, scratch):
    os.mkfifo(scratch / "fifo.py")
    assert_refused(pipeforge(["profile", path, "--stages", "2", "-o", "costs2.json"], scratch), message)
    assert not (scratch / "costs2.json").exists()


@pytest.mark.parametrize("path, message", [
    ("/dev/zero", "is a character device"), ("fifo.json", "is a FIFO"), ("folder.pipe", "is a directory"),
    ("big.json", "may hold at most 4 MiB"), ("missing.json", "no such file"),
])
def test_plan_refuses_a_layer_cost_path_that_is_not_a_bounded_regular_file(path, message, scratch):
    assert_refused(pipeforge(["plan", path, "--ranks", "2", "--microbatches", "4", "-o", "planned.pipe"], scratch),
                   message)
    assert not (scratch / "planned.pipe").exists()


@pytest.mark.parametrize("command", sorted(WRITERS))
@pytest.mark.parametrize("where, message", [
    ("small.csv/out", "'small.csv' is not a folder"), ("nowhere/out", "directory 'nowhere' does not exist"),
    ("a" * 300, "File name too long"),
])
def test_an_output_path_that_cannot_be_a_file_is_refused(command, where, message, scratch):
    if command == "codegen" and where.startswith("nowhere"):  # codegen makes its output folder (docs/cli.md)
        assert pipeforge(WRITERS[command](where + ".py"), scratch).returncode == 0
        assert (scratch / "nowhere" / "out.py").is_file()
        return
    before = snapshot(scratch)
    assert_refused(pipeforge(WRITERS[command](where + SUFFIX[command]), scratch), message)
    assert snapshot(scratch) == before


@pytest.mark.parametrize("path, message", [("small.csv/x.pipe", "Not a directory"),
                                           ("b" * 300 + ".pipe", "File name too long")])
@pytest.mark.parametrize("command", ["verify", "fmt", "codegen"])
def test_an_input_path_that_cannot_name_a_file_is_refused(command, path, message, scratch):
    assert_refused(pipeforge(READERS[command](path), scratch), message)


JSON_CASES = {
    "deep.json": ("[" * 100_000 + "]" * 100_000, "nest too deeply"),
    "long.json": ('{"stages": [{"F": ' + "1" * 5000 + ', "I": 1, "W": 1}]}', "an integer of 5000 digits; at most 40"),
    "broken.json": ('{"stages": [', "not JSON"),
    "latin1.json": (b'{"units": "\xe9"}', "not UTF-8 text"),
}


@pytest.mark.parametrize("name", sorted(JSON_CASES))
@pytest.mark.parametrize("command", ["simulate", "optimize", "plan", "diagnose"])
def test_a_json_input_is_parsed_within_bounds(command, name, scratch):
    """Cost files, layer cost files and failure records: deep nesting and huge numbers once ended in a
    RecursionError or ValueError (exit 70)."""
    text, message = JSON_CASES[name]
    target = scratch / ("records/rank-0.json" if command == "diagnose" else name)
    target.parent.mkdir(exist_ok=True)
    target.write_bytes(text if isinstance(text, bytes) else text.encode())
    argv = {"simulate": ["simulate", "small.pipe", "--costs", name],
            "optimize": ["optimize", "small.pipe", "--costs", name, "-o", "out.pipe", "--time-limit", "5"],
            "plan": ["plan", name, "--ranks", "2", "--microbatches", "4", "-o", "out.pipe"],
            "diagnose": ["diagnose", "records"]}[command]
    assert_refused(pipeforge(argv, scratch), message)
    assert not (scratch / "out.pipe").exists()


@pytest.mark.parametrize("kind", ["fifo", "device"])
def test_diagnose_refuses_a_record_that_is_not_a_regular_file(kind, scratch):
    (scratch / "records").mkdir()
    if kind == "fifo":
        os.mkfifo(scratch / "records" / "rank-0.json")
    else:
        (scratch / "records" / "rank-0.json").symlink_to("/dev/zero")
    assert_refused(pipeforge(["diagnose", "records"], scratch), "not a regular file")
