"""Hostile paths for the writers and readers ``test_hostile_inputs.py`` leaves out, same contract.

Its writers write ``.pipe``, ``.svg`` and ``.py``; here the other outputs (CSV, the
text grid, HTML, traces, ``plan``'s source and layer map, ``profile``'s cost file,
``export``'s CSV and settings) meet FIFOs, folders, device links and read-only
folders; ``export`` and ``diagnose`` and ``show --costs`` meet bad inputs; an output
that is an input stays refused with ``--force``; and paths holding ESC come back
escaped in what a command prints on success and on failure.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.hostile.test_hostile_inputs import SUFFIX as FIRST_SUFFIX
from tests.hostile.test_hostile_inputs import WRITERS as FIRST_WRITERS
from tests.hostile.test_hostile_inputs import (
    BAD_INPUTS,
    IS_ROOT,
    _can_create,
    assert_refused,
    pipeforge,
    scratch,  # noqa: F401 (the fixture here builds on)
    snapshot,
)

LAYERS = {"units": "ms", "layers": [{"F": 1, "I": 1, "W": 1, "activation": 1}] * 2}

# command -> (the command line writing OUT, OUT's suffix)
WRITERS = {
    "lower .csv": (lambda out: ["lower", "small.pipe", "-o", out], ".csv"),
    "convert .csv": (lambda out: ["convert", "small.pipe", out], ".csv"),
    "convert .json": (lambda out: ["convert", "small.pipe", out], ".json"),
    "show .txt": (lambda out: ["show", "small.pipe", "-o", out], ".txt"),
    "show .html": (lambda out: ["show", "small.pipe", "-o", out], ".html"),
    "show .json": (lambda out: ["show", "small.pipe", "-o", out], ".json"),
    "plan": (lambda out: ["plan", "layers.json", "--ranks", "2", "--microbatches", "2", "-o", out], ".pipe"),
    "plan layer map": (lambda out: ["plan", "layers.json", "--ranks", "2", "--microbatches", "2", "-o", "p.pipe",
                                    "--layer-map", out], ".json"),
    "profile": (lambda out: ["profile", "model.py", "--stages", "2", "-o", out], ".json"),  # refused before it runs
}


@pytest.fixture
def here(request) -> Path:
    """``test_hostile_inputs``'s scratch folder, with a layer cost file."""
    folder = request.getfixturevalue("scratch")
    (folder / "layers.json").write_text(json.dumps(LAYERS))
    return folder


@pytest.mark.parametrize("command", sorted(WRITERS))
@pytest.mark.parametrize("kind, message", [("fifo", "FIFO"), ("folder", "directory"),
                                           ("device", "character device"),
                                           ("loop", "Too many levels of symbolic links"),
                                           ("dangling", "which does not exist")])
def test_an_output_that_is_not_a_regular_file_is_refused_and_kept(command, kind, message, here):
    argv, suffix = WRITERS[command]
    out = here / f"sink{suffix}"
    {"fifo": lambda: os.mkfifo(out), "folder": out.mkdir, "device": lambda: out.symlink_to("/dev/null"),
     "loop": lambda: out.symlink_to(out.name), "dangling": lambda: out.symlink_to("nowhere/x")}[kind]()
    before = snapshot(here)
    assert_refused(pipeforge(argv(out.name), here), message)
    assert snapshot(here) == before and os.path.lexists(out)
    assert out.is_fifo() if kind == "fifo" else out.is_dir() if kind == "folder" else out.is_symlink()


@pytest.mark.parametrize("command", sorted(FIRST_WRITERS))
@pytest.mark.parametrize("kind, message", [("loop", "Too many levels of symbolic links"),
                                           ("dangling", "which does not exist")])
def test_an_output_that_is_a_link_loop_or_dangling_is_refused_and_kept(command, kind, message, here):
    out = here / f"link{FIRST_SUFFIX[command]}"
    out.symlink_to(out.name if kind == "loop" else "nowhere/x")
    before = snapshot(here)
    assert_refused(pipeforge(FIRST_WRITERS[command](out.name), here), message)
    assert snapshot(here) == before and out.is_symlink()


@pytest.mark.parametrize("command", sorted(set(WRITERS) - {"profile"}))  # profile measures first: minutes
def test_an_output_inside_a_read_only_folder_is_refused(command, here):
    argv, suffix = WRITERS[command]
    out = read_only_folder(here) + f"/out{suffix}"
    before = snapshot(here)
    assert_refused(pipeforge(argv(out), here), "cannot write")
    assert not Path(here / out).exists() and snapshot(here) == before


def read_only_folder(folder: Path) -> str:
    """A folder this process cannot create a file in (for root: sysfs), as a path from ``folder``."""
    if IS_ROOT:
        if not Path("/sys").is_dir() or os.access("/sys", os.W_OK) and _can_create("/sys"):
            pytest.skip("no folder here that root cannot write into")
        return "/sys"
    (folder / "locked").mkdir()
    (folder / "locked").chmod(0o555)
    return "locked"


EXPORT = ["export", "torchtitan", "small.pipe", "-o", "out"]


@pytest.mark.parametrize("name, make, message", [
    ("a file where the folder goes", lambda out: out.write_text("x"), "'out' is not a folder"),
    ("a FIFO at the CSV", lambda out: (out.mkdir(), os.mkfifo(out / "tiny.csv")), "FIFO"),
    ("a folder at the settings", lambda out: (out.mkdir(), (out / "tiny.toml").mkdir()), "directory"),
    ("a device link at the settings", lambda out: (out.mkdir(), (out / "tiny.toml").symlink_to("/dev/null")),
     "character device"),
    ("another file at the settings", lambda out: (out.mkdir(), (out / "tiny.toml").write_text("mine\n")),
     "'out/tiny.toml' exists and holds something other than what this writes"),
], ids=lambda value: value if isinstance(value, str) and " " in value else "")
def test_export_writes_both_files_or_neither(name, make, message, here):
    make(here / "out")
    before = snapshot(here)
    assert_refused(pipeforge(EXPORT, here), message)
    assert snapshot(here) == before  # the CSV is not written when the settings cannot be


def test_export_into_a_read_only_folder_is_refused(here):
    folder = read_only_folder(here)
    assert_refused(pipeforge(["export", "torchtitan", "small.pipe", "-o", folder], here), "cannot")
    assert not (Path(here / folder) / "tiny.csv").exists()


@pytest.mark.parametrize("path", sorted(BAD_INPUTS))
def test_export_refuses_a_bad_input_file_before_it_is_read(path, here):
    before = snapshot(here)
    assert_refused(pipeforge(["export", "torchtitan", path, "-o", "out"], here), BAD_INPUTS[path])
    assert snapshot(here) == before


@pytest.mark.parametrize("path, message", [
    ("/dev/zero", "is a character device"), ("fifo.json", "is a FIFO"), ("folder.pipe", "is a directory"),
    ("big.json", "may hold at most 4 MiB"), ("missing.json", "no such file"),
    ("loop_a.pipe", "Too many levels of symbolic links"),
])
@pytest.mark.parametrize("command", ["show", "simulate", "plan"])
def test_a_bad_cost_file_is_refused_by_every_reader(command, path, message, here):
    argv = {"show": ["show", "small.pipe", "--costs", path, "-o", "out.svg"],
            "simulate": ["simulate", "small.pipe", "--costs", path],
            "plan": ["plan", path, "--ranks", "2", "--microbatches", "2", "-o", "out.pipe"]}[command]
    before = snapshot(here)
    assert_refused(pipeforge(argv, here), message)
    assert snapshot(here) == before


@pytest.mark.parametrize("make", [lambda d: os.mkfifo(d), lambda d: d.write_text("x"), lambda d: d.symlink_to(d),
                                  lambda d: None, lambda d: d.symlink_to("/dev/zero")],
                         ids=["fifo", "file", "loop", "missing", "device"])
def test_diagnose_refuses_a_records_path_that_is_not_a_folder(make, here):
    make(here / "records")
    assert_refused(pipeforge(["diagnose", "records"], here), "'records' is not a directory of records")


@pytest.mark.parametrize("argv", [
    ["fmt", "small.pipe", "-o", "small.pipe", "--force"],
    ["convert", "small.csv", "small.csv", "--force"],
    ["lower", "small.pipe", "-o", "small.pipe", "--force"],
    ["optimize", "small.pipe", "-o", "small.pipe", "--time-limit", "5", "--force"],
    ["show", "small.pipe", "--costs", "costs.json", "-o", "costs.json", "--force"],
    ["plan", "layers.json", "--ranks", "2", "--microbatches", "2", "-o", "p.pipe", "--layer-map", "layers.json",
     "--force"],
    ["export", "torchtitan", "tiny.csv", "-o", ".", "--force"],
], ids=" ".join)
def test_an_output_that_is_an_input_is_refused_even_with_force(argv, here):
    (here / "tiny.csv").write_text("0F0,0F1,0B0,0B1\n1F0,1B0,1F1,1B1\n")
    before = snapshot(here)
    assert_refused(pipeforge(argv, here), "is the input")
    assert snapshot(here) == before


ESCAPED = "e\x1b]0;owned\x07"


@pytest.mark.parametrize("argv", [
    ["optimize", "small.pipe", "--strategy", "greedy", "-o", f"{ESCAPED}.pipe"],
    ["export", "torchtitan", "small.pipe", "-o", ESCAPED],
    ["codegen", "small.pipe", "-o", f"{ESCAPED}/tiny.py"],
    ["plan", "layers.json", "--ranks", "2", "--microbatches", "2", "-o", f"{ESCAPED}.pipe"],
], ids=lambda argv: argv[0])
def test_a_path_with_escape_bytes_is_printed_escaped(argv, here):
    done = pipeforge(argv, here)
    assert done.returncode == 0, done.stderr
    assert b"\x1b" not in done.stdout and b"\x07" not in done.stdout and b"\\x1b" in done.stdout
    again = pipeforge([*argv[:-1], argv[-1].replace("e\x1b", "nowhere/e\x1b")], here)
    if argv[0] not in ("codegen", "export"):  # those two make their output folder
        assert_refused(again, "does not exist")


def test_two_outputs_of_one_command_on_one_file_are_refused(here):
    argv = ["plan", "layers.json", "--ranks", "2", "--microbatches", "2", "-o", "p.pipe", "--layer-map", "./p.pipe"]
    assert_refused(pipeforge(argv, here), "name one file")
    assert not (here / "p.pipe").exists()


@pytest.mark.parametrize("module, message", [
    ("/dev/zero", "is a character device"), ("fifo.py", "is a FIFO"), ("folder.pipe", "is a directory"),
    ("loop_a.pipe", "Too many levels of symbolic links"), ("big.pipe", "may hold at most 64 MiB"),
    ("deep.py", "not a Python module"), ("nul.py", "not a Python module: source code string cannot contain null"),
])
def test_diagnose_reads_the_module_a_record_names_within_bounds(module, message, here):
    """``pipeforge diagnose`` reads the generated module each record (or ``--module``) names: a FIFO there once
    blocked it, /dev/zero streamed without end, a deeply nested file overflowed the parser."""
    from pipeforge.errors import UsageError
    from pipeforge.tools.diagnose import read_program

    os.mkfifo(here / "fifo.py")
    with open(here / "big.pipe", "r+b") as big:
        big.truncate(65 << 20)
    (here / "deep.py").write_text("x = " + "-" * 1_000_000 + "1\n")  # past the parser's own stack
    (here / "nul.py").write_bytes(b"x = 1\0\n")
    with pytest.raises(UsageError, match=message):
        read_program({"rank": 0, "module": str(here / module)})


def test_diagnose_looks_for_sources_past_what_is_not_a_bounded_regular_file(here):
    from pipeforge.tools.diagnose import find_source

    for name in ("fifo.pipe", "zero.pipe", "big.pipe", "loop_a.pipe", "folder.pipe"):
        assert find_source(name, here) is None
    assert find_source("small.pipe", here).text.startswith("schedule tiny")
