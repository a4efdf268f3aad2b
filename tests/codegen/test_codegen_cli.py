"""``pipeforge codegen`` and ``pipeforge run`` through the command line."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from pipeforge.cli import main
from pipeforge.commands import run as run_command

BROKEN = """\
schedule broken(P = 2, M = 1) {
    ranks P
    stages P placement loop
    microbatches M
    rank 0 { F(0, 0) B(0, 0) }
    rank 1 { B(1, 0) F(1, 0) }
}
"""


def written(path: Path) -> tuple[str, list[str]]:
    """The module codegen wrote at ``path`` and its rank modules' text, by rank."""
    (folder,) = path.parent.glob(f"{path.stem}_ranks_*")
    ranks = sorted(folder.glob("rank_*.py"), key=lambda p: int(p.stem.removeprefix("rank_")))
    return path.read_text(), [p.read_text() for p in ranks]


def test_codegen_writes_the_module(tmp_path, capsys):
    assert main(["codegen", "gpipe", "-D", "P=2", "-D", "M=2", "-o", str(tmp_path), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    module = tmp_path / f"{out['schedule']}.py"
    (folder,) = tmp_path.glob(f"{out['schedule']}_ranks_*")
    assert out == {"schedule": out["schedule"], "module": str(module), "ranks": 2, "rank_folder": str(folder)}
    text, ranks = written(module)
    assert "def make_pipeline(" in text and f"RANK_FOLDER = {folder.name!r}" in text
    assert all("gpipe.pipe:" in rank for rank in ranks) and "def rank_1(ctx: RankContext)" in ranks[1]


def test_codegen_without_locations_matches_the_golden(tmp_path, goldens, capsys):
    source = Path(__file__).parent / "programs" / "lowered_1f1b.pipe"
    assert main(["codegen", str(source), "-o", str(tmp_path), "--no-locations"]) == 0
    assert "wrote" in capsys.readouterr().out
    text, ranks = written(tmp_path / "lowered_1f1b.py")
    goldens.check("lowered_1f1b.main.py.txt", text)
    for rank, rank_text in enumerate(ranks):
        goldens.check(f"lowered_1f1b.rank_{rank}.py.txt", rank_text)


def test_codegen_with_locations_names_the_pipe_lines(tmp_path):
    source = Path(__file__).parent / "programs" / "lowered_1f1b.pipe"
    assert main(["codegen", str(source), "-o", str(tmp_path)]) == 0
    text = "".join(written(tmp_path / "lowered_1f1b.py")[1])
    assert "    forward(0, 0)  # 0F0 lowered_1f1b.pipe:8:9 step 0\n" in text
    assert "    post('1SEND_B2')  # 1SEND_B2 lowered_1f1b.pipe:19:9 step 9\n" in text
    assert "    post('0SEND_F1', '0RECV_B0')  # [0SEND_F1 0RECV_B0] lowered_1f1b.pipe:9:13 step 3\n" in text


def test_rewriting_a_module_leaves_one_complete_rank_folder(tmp_path):
    source = Path(__file__).parent / "programs" / "lowered_1f1b.pipe"
    assert main(["codegen", str(source), "-o", str(tmp_path), "--no-locations"]) == 0
    first = sorted(p.name for p in tmp_path.iterdir())
    assert main(["codegen", str(source), "-o", str(tmp_path), "--no-locations"]) == 0  # same text: same folder
    assert sorted(p.name for p in tmp_path.iterdir()) == first
    assert main(["codegen", str(source), "-o", str(tmp_path)]) == 0  # other text: a new folder, the old one gone
    names = sorted(p.name for p in tmp_path.iterdir())
    assert len(names) == 2 and names != first and not any(n.startswith(".") for n in names)


def test_codegen_refuses_an_invalid_schedule_with_exit_1(tmp_path, capsys):
    source = tmp_path / "broken.pipe"
    source.write_text(BROKEN)
    assert main(["codegen", str(source), "-o", str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err
    assert "does not verify" in err and "broken.pipe:6" in err
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_codegen_names_modules_and_refuses_to_overwrite_another_schedule(tmp_path, capsys):
    source = Path(__file__).parent / "programs" / "lowered_1f1b.pipe"
    out = tmp_path / "gen"
    assert main(["codegen", "gpipe", "-D", "P=2", "-D", "M=3", "-o", str(out), "--name", "lowered_1f1b"]) == 0
    before = (out / "lowered_1f1b.py").read_text()
    capsys.readouterr()
    assert main(["codegen", str(source), "-o", str(out)]) == 2  # same file name, another schedule
    err = capsys.readouterr().err
    assert "holds the module of schedule 'gpipe' (P=2, M=3)" in err and "--force" in err and "Traceback" not in err
    assert (out / "lowered_1f1b.py").read_text() == before
    assert main(["codegen", str(source), "-o", str(out / "hand.py")]) == 0
    assert main(["codegen", str(source), "-o", str(out), "--force"]) == 0
    assert "name='lowered_1f1b'" in (out / "lowered_1f1b.py").read_text()


@pytest.mark.parametrize("flags", [["--name", "my-module"], ["--name", "for"], ["-o-placeholder", "bad name.py"]])
def test_codegen_refuses_a_module_name_that_is_not_an_identifier(tmp_path, capsys, flags):
    out = str(tmp_path / "gen")
    if flags[0] == "-o-placeholder":
        out, flags = str(tmp_path / flags[1]), []
    assert main(["codegen", "1f1b", "-D", "P=2", "-D", "M=2", "-o", out, *flags]) == 2
    err = capsys.readouterr().err
    assert "is not a Python identifier" in err and "Traceback" not in err
    assert list(tmp_path.iterdir()) == []


def test_run_with_the_wrong_process_count_is_a_usage_error(capsys):
    assert main(["run", "1f1b", "-D", "P=2", "--nproc", "3"]) == 2
    assert "--nproc" in capsys.readouterr().err


def test_print_torchrun(capsys):
    assert main(["run", "1f1b", "-D", "P=4", "-D", "M=8", "--print-torchrun"]) == 0
    out = capsys.readouterr().out
    assert "torchrun --nnodes=$NODES --nproc-per-node=$NPROC_PER_NODE" in out
    assert "-m pipeforge run 1f1b -DP=4 -DM=8 --steps 2" in out and "--from-env" in out


@pytest.mark.distributed
@pytest.mark.timeout(120)
def test_run_json_on_four_processes(capsys):
    assert main(["run", "1f1b", "-D", "P=4", "-D", "M=8", "--json", "--steps", "2"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out == {"match": True, "max_abs_diff": 0.0, "steps": 2, "nproc": 4, "backend": "gloo"}


@pytest.mark.distributed
@pytest.mark.timeout(120)
def test_run_text_with_tuple_activations(capsys):
    assert main(["run", "zbv", "-D", "P=2", "-D", "M=4", "--model", "tuple"]) == 0
    assert "match on 2 processes (gloo)" in capsys.readouterr().out


@pytest.mark.parametrize("verdict, code, stderr", [
    ({"match": True, "max_abs_diff": 0.0}, 0, ""),
    ({"match": False, "max_abs_diff": 0.5, "worst": "step 0 stage 1 grad of linear.weight", "missing": []}, 1,
     "largest difference: step 0 stage 1 grad of linear.weight"),
    ({"match": False, "max_abs_diff": None, "errors": {1: "Traceback\nPipelineError: rank 1: boom"}}, 1,
     "rank 1: PipelineError: rank 1: boom"),
])
def test_run_exit_codes_and_reports(verdict, code, stderr, capsys):
    args = argparse.Namespace(json=True, steps=2, backend="gloo", model="mlp")
    assert run_command._report(args, "s", 2, verdict, 1.0) == code
    captured = capsys.readouterr()
    assert json.loads(captured.out)["match"] is verdict["match"]
    assert stderr in captured.err


def test_a_crafted_file_name_stays_inside_comments(tmp_path):
    import ast

    source = tmp_path / "x'; import os\n#\"q.pipe"
    source.write_text((Path(__file__).parent / "programs" / "lowered_1f1b.pipe").read_text())
    assert main(["codegen", str(source), "-o", str(tmp_path / "out")]) == 0
    text, ranks = written(tmp_path / "out" / "lowered_1f1b.py")
    imports = [n for n in ast.walk(ast.parse(text)) if isinstance(n, (ast.Import, ast.ImportFrom))]
    assert [ast.unparse(n) for n in imports] == ["import torch", "from pipeforge import runtime"]
    for rank_text in ranks:
        imports = [n for n in ast.walk(ast.parse(rank_text)) if isinstance(n, (ast.Import, ast.ImportFrom))]
        assert [ast.unparse(n) for n in imports] == ["from __future__ import annotations",
                                                     "from typing import TYPE_CHECKING",
                                                     "from pipeforge.runtime import RankContext"]
    assert "  # 0F0 'x\\'; import os\\n#\"q.pipe':8:9 step 0\n" in ranks[0]


def test_run_without_torch_is_refused_plainly(monkeypatch, capsys):
    import importlib.util

    from pipeforge.cli import main

    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "torch" else real_find_spec(name, *a))
    assert main(["run", "1f1b", "-D", "P=2", "-D", "M=2", "--nproc", "2"]) == 2
    err = capsys.readouterr().err
    assert "'pipeforge run' needs torch" in err and "Traceback" not in err


@pytest.mark.parametrize("name, defines", [("zbv", ["P=2", "M=4"]), ("dualpipev", ["P=2", "M=4"]),
                                           ("interleaved-1f1b", ["P=32", "M=64"])])
def test_generated_modules_pass_ruff(tmp_path, name, defines):
    import shutil
    import subprocess

    ruff = shutil.which("ruff")
    if ruff is None:
        pytest.skip("ruff is not installed (it is a dev dependency)")
    args = ["codegen", name, "-o", str(tmp_path)]
    for define in defines:
        args += ["-D", define]
    assert main(args) == 0
    # the project's own rules and line length (pyproject.toml), plus pycodestyle and pyflakes in full
    done = subprocess.run([ruff, "check", "--no-cache", "--select", "E,W,F,I", "--line-length", "120", str(tmp_path)],
                          capture_output=True, text=True, cwd=Path(__file__).parents[2], check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert max(len(line) for p in tmp_path.rglob("*.py") for line in p.read_text().splitlines()) <= 120
