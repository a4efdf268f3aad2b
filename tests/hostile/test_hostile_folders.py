"""Outputs that make their folder, and module names that would shadow another module, in process.

A failed or refused output leaves no folder it made (``files._made_folders``): codegen of a schedule whose
module name is too long for the file system once left ``new/deeper/`` behind, empty, though docs/cli.md
says all or nothing. A generated module named after a module it or Python imports (a schedule named
``torch``) was imported in that module's place by any script beside it: ``import torch`` found the
generated file, whose own ``import torch.distributed`` then failed.
"""

from __future__ import annotations

import pytest

from pipeforge.cli import main
from pipeforge.errors import UsageError
from pipeforge.files import locked_output, write_outputs

LONG = "a" * 300  # a file name longer than the file system's 255 bytes


def schedule_text(name: str) -> str:
    return (f"schedule {name} {{ ranks 1 stages 1 placement loop microbatches 1 "
            "rank r { F(0, 0) B(0, 0) } }\n")


def run(argv: list[str], capsys) -> tuple[int, str]:
    code = main(argv)
    err = capsys.readouterr().err
    assert "Traceback" not in err and "bug in pipeforge" not in err, err
    return code, err


@pytest.mark.parametrize("argv", [
    ["codegen", "long.pipe", "-o", "new/deeper/"],
    ["export", "torchtitan", "long.pipe", "-o", "new/deeper"],
], ids=["codegen", "export"])
def test_a_failed_output_leaves_no_folder_it_made(argv, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "long.pipe").write_text(schedule_text(LONG))
    code, err = run(argv, capsys)
    assert code == 2 and "File name too long" in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["long.pipe"]


def test_a_refused_output_removes_only_the_folders_it_made(tmp_path):
    (tmp_path / "kept").mkdir()
    with pytest.raises(RuntimeError), locked_output(tmp_path / "kept" / "a" / "b" / "out.py", make_dirs=True):
        raise RuntimeError("the output failed")
    assert [p.name for p in (tmp_path / "kept").iterdir()] == []
    with pytest.raises(RuntimeError), locked_output(tmp_path / "c" / "d" / "out.py", make_dirs=True):
        (tmp_path / "c" / "other").write_text("put there meanwhile")
        raise RuntimeError("the output failed")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c", "kept"]  # c holds another file: it stays
    assert sorted(p.name for p in (tmp_path / "c").iterdir()) == ["other"]


def test_files_written_together_leave_no_folder_when_one_is_refused(tmp_path):
    (tmp_path / "taken.csv").write_text("another file")
    with pytest.raises(UsageError, match="exists and holds something other"):
        write_outputs([(tmp_path / "new" / "a.toml", "x"), (tmp_path / "taken.csv", "y")], make_dirs=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["taken.csv"]


@pytest.mark.parametrize("name", ["torch", "pipeforge", "json", "os"])
def test_a_schedule_named_after_a_module_gets_a_module_name_of_its_own(name, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "s.pipe").write_text(schedule_text(name))
    code, err = run(["codegen", "s.pipe", "-o", "gen/"], capsys)
    assert code == 0, err
    assert (tmp_path / "gen" / f"schedule_{name}.py").is_file() and not (tmp_path / "gen" / f"{name}.py").exists()


@pytest.mark.parametrize("flags", [["-o", "torch.py"], ["-o", "gen/", "--name", "json"]], ids=" ".join)
def test_a_module_name_that_would_shadow_a_module_is_refused(flags, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "s.pipe").write_text(schedule_text("s"))
    code, err = run(["codegen", "s.pipe", *flags], capsys)
    assert code == 2 and "a file of that name would be imported in its place" in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.pipe"]
