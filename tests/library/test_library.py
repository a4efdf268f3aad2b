"""The library's API (names, describe, source, path, load) and its two commands, library and new."""

from __future__ import annotations

import json

import pytest

import pipeforge
from pipeforge import library
from pipeforge.cli import main
from pipeforge.errors import PipeforgeError, UsageError

EXPECTED = {
    "gpipe", "1f1b", "interleaved-1f1b", "looped-bfs", "interleaved-zb", "zbv", "dualpipev",
    "zb-h1", "zb-h2", "chimera", "v-min", "v-half",
}


def test_names_lists_every_schedule_sorted():
    assert EXPECTED <= set(library.names())
    assert library.names() == sorted(library.names())


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_describe_gives_the_first_comment_line_and_the_header_defaults(name):
    description, params = library.describe(name)
    assert library.source(name).splitlines()[0] == f"# {description}"
    assert [p for p, _ in params][:2] == ["P", "M"]
    assert all(isinstance(default, int) for _, default in params)
    assert library.load_library_schedule(name).params == tuple(params)


def test_interleaved_schedules_take_stages_per_rank():
    assert dict(library.describe("interleaved-1f1b")[1]) == {"P": 4, "M": 8, "V": 2}
    assert library.load_library_schedule("looped-bfs", {"V": 3}).stages == 12


def test_path_and_source_agree():
    assert library.path("zbv").name == "zbv.pipe"
    assert library.source("zbv") == library.path("zbv").read_text(encoding="utf-8")


def test_unknown_name_is_a_usage_error_listing_the_library():
    with pytest.raises(UsageError) as error:
        library.path("2f2b")
    assert "1f1b" in str(error.value) and "zbv" in str(error.value)


def test_pipeforge_load_finds_library_names():
    schedule = pipeforge.load("1f1b", defines={"P": 2, "M": 3})
    assert (schedule.ranks, schedule.microbatches) == (2, 3)


@pytest.mark.parametrize("name,defines", [("dualpipev", {"M": 3}), ("chimera", {"P": 3}), ("zbv", {"Q": 1})])
def test_refused_parameters_raise_errors_with_a_location(name, defines):
    with pytest.raises(PipeforgeError):
        library.load_library_schedule(name, defines)


@pytest.mark.parametrize("name,defines", [("1f1b", {"P": 8}), ("interleaved-zb", {"P": 3, "M": 6, "V": 4}),
                                          ("chimera", {"M": 12, "P": 6}), ("gpipe", {})])
def test_new_defaults_elaborate_like_the_defines(name, defines):
    text = library.source_with_defaults(name, defines)
    assert pipeforge.loads(text) == library.load_library_schedule(name, defines)
    assert text.splitlines()[0] == library.source(name).splitlines()[0]


def test_library_command_lists_names_descriptions_and_parameters(capsys):
    assert main(["library"]) == 0
    out = capsys.readouterr().out
    for name in EXPECTED:
        description, _ = library.describe(name)
        assert any(line.startswith(name + " ") and description in line for line in out.splitlines())
    assert "P=4 M=8 V=2" in out


def test_library_command_json(capsys):
    assert main(["library", "--json"]) == 0
    listed = {row["name"]: row for row in json.loads(capsys.readouterr().out)["schedules"]}
    assert EXPECTED <= set(listed)
    assert listed["zbv"]["parameters"] == [{"name": "P", "default": 4}, {"name": "M", "default": 8}]


def test_new_writes_the_file_with_defaults_substituted(tmp_path, capsys):
    target = tmp_path / "mine.pipe"
    assert main(["new", "zb-h2", "-D", "P=6", "-D", "M=13", "-o", str(target)]) == 0
    assert pipeforge.load(str(target)) == library.load_library_schedule("zb-h2", {"P": 6, "M": 13})
    assert "schedule zb_h2(P = 6, M = 13)" in target.read_text()
    assert [p.name for p in tmp_path.iterdir()] == ["mine.pipe"]  # no temporary left behind


def test_new_without_output_prints_the_source(capsys):
    assert main(["new", "gpipe"]) == 0
    assert capsys.readouterr().out == library.source("gpipe")


@pytest.mark.parametrize("argv,says", [
    (["new", "nope"], "1f1b"),
    (["new", "dualpipev", "-D", "M=3"], "M >= 2P"),
    (["new", "1f1b", "-D", "X=1"], "no parameter 'X'"),
    (["new", "1f1b", "-D", "P=four"], "must be an integer"),
])
def test_new_refuses_with_exit_2(argv, says, tmp_path, capsys):
    target = tmp_path / "out.pipe"
    assert main(argv + ["-o", str(target)]) == 2
    assert says in capsys.readouterr().err
    assert not target.exists()


def test_new_keeps_an_existing_file_when_refusing(tmp_path):
    target = tmp_path / "keep.pipe"
    target.write_text("old")
    assert main(["new", "dualpipev", "-D", "M=1", "-o", str(target)]) == 2
    assert target.read_text() == "old"
