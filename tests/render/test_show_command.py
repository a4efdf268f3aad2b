"""``pipeforge show``: every output form by its suffix, written atomically; unknown suffixes refused."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET

import pytest

from pipeforge.cli import main

ARGS = ["zb-h1", "-D", "P=4", "-D", "M=4"]


@pytest.mark.parametrize("suffix", [".svg", ".html", ".txt", ".json", ".png"])
def test_each_suffix_writes_its_form(tmp_path, suffix):
    if suffix == ".png":
        pytest.importorskip("cairosvg")
    out = tmp_path / f"picture{suffix}"
    assert main(["show", *ARGS, "-o", str(out)]) == 0
    data = out.read_bytes()
    if suffix == ".svg":
        ET.fromstring(data)
    elif suffix == ".json":
        assert len([e for e in json.loads(data)["traceEvents"] if e["ph"] == "X"]) == 4 * 4 * 3
    elif suffix == ".png":
        assert data.startswith(b"\x89PNG")
    elif suffix == ".txt":
        assert data.decode().startswith("rank 0 |F0")
    else:
        assert data.startswith(b"<!DOCTYPE html>")
    assert [p.name for p in tmp_path.iterdir()] == [out.name]  # no temporary left behind


def test_cost_and_title_flags(tmp_path):
    out = tmp_path / "p.svg"
    assert main(["show", *ARGS, "--cost", "F=2,comm=0.5", "--title", "mine", "-o", str(out)]) == 0
    root = ET.fromstring(out.read_bytes())
    assert "mine" in out.read_text() and root is not None


@pytest.mark.parametrize("name", ["p.pdf", "p", "p.svg.bak"])
def test_unknown_suffix_exits_2(tmp_path, capsys, name):
    assert main(["show", *ARGS, "-o", str(tmp_path / name)]) == 2
    assert "must end in" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_missing_directory_exits_2(tmp_path, capsys):
    assert main(["show", *ARGS, "-o", str(tmp_path / "nowhere" / "p.svg")]) == 2
    assert "does not exist" in capsys.readouterr().err
