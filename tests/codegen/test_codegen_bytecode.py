"""Rank modules compiled in worker processes (pipeforge.bytecode): the same code as compiling here, the
first source that does not compile named, and the bytecode codegen writes is what Python imports."""

from __future__ import annotations

import importlib.util
import marshal
import sys
import tempfile
import time
from pathlib import Path

import pytest

from pipeforge import bytecode, load
from pipeforge.bytecode import CompileError, Compiling
from pipeforge.errors import VerificationError
from pipeforge.generator import codegen, rank_folder
from pipeforge.ir import Placement, Schedule, programs_from_tokens


def sources(count: int, lines: int) -> list[tuple[str, str]]:
    body = "".join(f"    ctx.forward({i % 7}, {i})  # {i}F0 x.pipe:1:1 step {i}\n" for i in range(lines))
    return [(f"/nowhere/rank_{r}.py", f"def rank_{r}(ctx):\n{body}    ctx.rank = {r}\n") for r in range(count)]


@pytest.fixture
def parallel(monkeypatch):
    monkeypatch.setattr(bytecode, "PARALLEL_FROM", 0)  # workers even for small sources (the tests stay quick)


def test_workers_give_the_code_compiled_here(parallel):
    given = sources(5, 300)
    with Compiling(given, jobs=2) as compiling:
        assert len(compiling.workers) == 2
        codes = compiling.codes()
    for (filename, text), code in zip(given, codes, strict=True):
        assert marshal.loads(code) == compile(text, filename, "exec", dont_inherit=True)
        assert marshal.loads(code).co_filename == filename


@pytest.mark.parametrize("jobs, named_early", [(1, False), (2, False), (1, True)])
def test_sources_given_one_by_one_are_named_later(parallel, jobs, named_early):
    given = sources(6, 200)
    names = [filename for filename, _ in given]
    with Compiling(jobs=jobs) as compiling:
        for _, text in given:
            compiling.add(text)
        assert len(compiling.workers) == jobs
        claimed = Path(compiling.folder) / "claim_0"
        deadline = time.monotonic() + 60
        while not claimed.exists() and time.monotonic() < deadline:  # a worker has taken one at least
            time.sleep(0.01)
        assert claimed.exists()
        if named_early:  # as codegen does: named once rendered, codes asked for after verifying
            compiling.name(names)
            time.sleep(0.2)
            codes = compiling.codes()
        else:
            codes = compiling.codes(names)
    for (filename, text), code in zip(given, codes, strict=True):
        loaded = marshal.loads(code)
        assert loaded == compile(text, filename, "exec", dont_inherit=True)
        functions = [c for c in loaded.co_consts if hasattr(c, "co_filename")]
        assert functions and {loaded.co_filename, *(f.co_filename for f in functions)} == {filename}


def test_a_source_given_late_that_does_not_compile_is_named_with_its_file(parallel):
    given = sources(4, 20)
    with Compiling(jobs=1) as compiling, pytest.raises(CompileError) as raised:
        for index, (_, text) in enumerate(given):
            compiling.add(text + ("    ctx.forward(1,\n" if index == 1 else ""))
        compiling.codes([filename for filename, _ in given])
    assert raised.value.index == 1 and "never closed" in raised.value.message and "rank_1.py" in raised.value.message


def test_no_job_or_small_sources_compile_here(parallel):
    with Compiling(sources(3, 10), jobs=0) as compiling:
        assert compiling.workers == []
        assert len(compiling.codes()) == 3


def test_small_sources_compile_here():
    with Compiling(sources(3, 10), jobs=4) as compiling:
        assert compiling.workers == []
        assert len(compiling.codes()) == 3


@pytest.mark.parametrize("jobs", [0, 1, 2])
def test_the_first_source_that_does_not_compile_is_named(parallel, jobs):
    given = sources(4, 20)
    given[2] = (given[2][0], given[2][1] + "    ctx.forward(1,\n")
    with Compiling(given, jobs=jobs) as compiling, pytest.raises(CompileError) as raised:
        compiling.codes()
    assert raised.value.index == 2 and "never closed" in raised.value.message


def test_a_worker_that_dies_leaves_its_share_to_this_process(parallel):
    given = sources(4, 50)
    with Compiling(given, jobs=2) as compiling:
        compiling.workers[0][0].kill()
        codes = compiling.codes()
    assert [marshal.loads(code) for code in codes] == [compile(t, f, "exec", dont_inherit=True) for f, t in given]


def test_codegen_writes_the_bytecode_python_imports(tmp_path, parallel, monkeypatch):
    monkeypatch.setattr(sys, "dont_write_bytecode", False)
    path = codegen(load("zbv", defines={"P": 2, "M": 4}), tmp_path, jobs=2)
    folder = rank_folder(path)
    for rank in range(2):
        source = folder / f"rank_{rank}.py"
        cached = importlib.util.cache_from_source(str(source))
        data = open(cached, "rb").read()
        assert data[:4] == importlib.util.MAGIC_NUMBER
        assert marshal.loads(data[16:]) == compile(source.read_text(), str(source.resolve()), "exec",
                                                   dont_inherit=True)
        stat = source.stat()  # what the importer checks before it takes the cache (else it compiles again)
        assert data[4:16] == bytes(4) + int(stat.st_mtime).to_bytes(4, "little") + stat.st_size.to_bytes(4, "little")


def test_a_schedule_that_does_not_verify_stops_the_workers_and_leaves_nothing(tmp_path, parallel, monkeypatch):
    monkeypatch.setattr(sys, "dont_write_bytecode", False)  # (else codegen compiles nothing: no worker starts)
    temporary = tmp_path / "tmp"
    temporary.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temporary))  # the workers' folder goes here
    rows = [["0F0", "0B0"], ["1B0", "1F0"]]  # rank 1 runs B before F of microbatch 0: an order violation
    schedule = Schedule("broken", 2, 2, 1, (Placement.loop(2, 2),), programs_from_tokens(rows))
    started = []
    start = Compiling.started

    def noted(self):
        started.append(start(self))
        return started[-1]

    monkeypatch.setattr(Compiling, "started", noted)
    with pytest.raises(VerificationError):
        codegen(schedule, tmp_path / "out", jobs=1)
    assert len(started) == 1 and started[0][0].poll() is not None  # the worker was started, and is gone
    assert list(temporary.iterdir()) == [] and not (tmp_path / "out").exists()


def test_beyond_bytecode_up_to_codegen_writes_the_sources_alone(tmp_path, monkeypatch):
    """A large schedule's rank modules are written without bytecode (no process compiles them: each rank
    compiles its own when it first imports it), the same text as with it, and they run."""
    from pipeforge import generator
    from pipeforge.tools.generated import load_module

    monkeypatch.setattr(sys, "dont_write_bytecode", False)
    schedule = load("zbv", defines={"P": 2, "M": 4})
    with_code = codegen(schedule, tmp_path / "with")
    monkeypatch.setattr(generator, "BYTECODE_UP_TO", 0)
    monkeypatch.setattr(Compiling, "__init__", lambda *args, **kwargs: pytest.fail("compiled"))
    alone = codegen(schedule, tmp_path / "alone")
    folders = [rank_folder(path) for path in (with_code, alone)]
    assert (folders[0] / "__pycache__").is_dir() and not (folders[1] / "__pycache__").exists()
    assert [p.read_bytes() for p in sorted(folders[0].glob("*.py"))] == \
        [p.read_bytes() for p in sorted(folders[1].glob("*.py"))]
    module = load_module(str(alone))
    assert [module.PROGRAMS[rank].__name__ for rank in range(2)] == ["rank_0", "rank_1"]


def test_codegen_compiles_nothing_where_python_writes_no_bytecode(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    monkeypatch.setattr(Compiling, "__init__", lambda *args, **kwargs: pytest.fail("compiled"))
    path = codegen(load("1f1b", defines={"P": 2, "M": 4}), tmp_path)
    assert sorted(p.name for p in rank_folder(path).iterdir()) == ["rank_0.py", "rank_1.py"]
