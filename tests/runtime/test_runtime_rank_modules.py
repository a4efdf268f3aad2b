"""A rank module that must be compiled (no usable ``__pycache__``): past ``COMPILE_APART_FROM`` bytes it
compiles in a child process of this interpreter, giving the code Python gives here, its bytecode cached as
Python caches it; where no child can do it, or the source does not compile, it compiles here."""

from __future__ import annotations

import importlib.util
import marshal
import subprocess
import sys

import pytest

from pipeforge import load
from pipeforge.generator import codegen, rank_folder
from pipeforge.runtime import rank_modules
from pipeforge.runtime.rank_modules import RankModules, compile_apart
from pipeforge.tools.generated import load_module


@pytest.fixture
def children(monkeypatch):
    """Every rank module compiles apart (the threshold at 0); the compiler children started, listed."""
    monkeypatch.setattr(rank_modules, "COMPILE_APART_FROM", 0)
    started = []
    run = subprocess.run

    def noted(args, *rest, **kwargs):
        started.append(args)
        return run(args, *rest, **kwargs)

    monkeypatch.setattr(rank_modules.subprocess, "run", noted)
    return started


def generated(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "dont_write_bytecode", False)
    path = codegen(load("zbv", defines={"P": 2, "M": 4}), tmp_path, jobs=0)
    folder = rank_folder(path)
    for cached in folder.glob("__pycache__/*"):  # as where the bytecode was not copied
        cached.unlink()
    return path, folder


def test_a_rank_module_without_bytecode_compiles_apart_as_here(tmp_path, monkeypatch, children):
    path, folder = generated(tmp_path, monkeypatch)
    program = load_module(str(path)).PROGRAMS[1]
    source = folder / "rank_1.py"
    assert len(children) == 1 and children[0][:4] == [sys.executable, "-I", "-S", "-c"]
    assert program.__code__.co_filename == str(source.resolve())
    here = compile(source.read_bytes(), str(source.resolve()), "exec", dont_inherit=True)
    assert program.__code__ == next(c for c in here.co_consts if getattr(c, "co_name", None) == "rank_1")
    data = open(importlib.util.cache_from_source(str(source)), "rb").read()  # cached as Python caches it
    assert data[:4] == importlib.util.MAGIC_NUMBER and marshal.loads(data[16:]) == here
    RankModules(str(path), folder.name, 2)[1]  # taken from that cache: no child again
    assert len(children) == 1


def test_small_rank_modules_compile_here(tmp_path, monkeypatch):
    started = []
    monkeypatch.setattr(rank_modules.subprocess, "run", lambda *args, **kwargs: started.append(args))
    path, _ = generated(tmp_path, monkeypatch)
    assert load_module(str(path)).PROGRAMS[0].__name__ == "rank_0" and started == []


def test_without_an_interpreter_to_start_the_module_compiles_here(tmp_path, monkeypatch, children):
    path, _ = generated(tmp_path, monkeypatch)
    monkeypatch.setattr(sys, "executable", "")
    assert load_module(str(path)).PROGRAMS[0].__name__ == "rank_0" and children == []
    monkeypatch.setattr(sys, "executable", str(tmp_path / "no-such-python"))
    assert compile_apart(b"x = 1\n", "x.py") is None


def test_a_rank_module_that_does_not_compile_raises_python_s_error_naming_its_line(tmp_path, monkeypatch, children):
    path, folder = generated(tmp_path, monkeypatch)
    source = folder / "rank_1.py"
    source.write_text(source.read_text() + "    forward(1,\n")
    with pytest.raises(SyntaxError) as raised:
        RankModules(str(path), folder.name, 2)[1]
    assert len(children) == 1 and raised.value.filename == str(source) and "never closed" in str(raised.value)


def test_another_program_or_a_child_past_its_time_leaves_the_compile_here(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "executable", "/bin/echo")  # answers, but not with this interpreter's bytecode
    assert compile_apart(b"x = 1\n", "x.py") is None
    slow = tmp_path / "slow-python"
    slow.write_text("#!/bin/sh\nexec sleep 30\n")
    slow.chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(slow))
    monkeypatch.setattr(rank_modules, "COMPILE_APART_SECONDS", 0.5)
    assert compile_apart(b"x = 1\n", "x.py") is None
