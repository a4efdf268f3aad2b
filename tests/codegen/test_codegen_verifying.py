"""codegen verifies a large schedule in a forked child beside its rendering (generator.Verifying): the same
output and the same report as verifying in the caller, the child always reaped, and any answer but "valid"
(an invalid schedule, a child that fails or dies) decided again in the caller."""

from __future__ import annotations

import os
import time

import pytest

from pipeforge import generator, load
from pipeforge.errors import VerificationError
from pipeforge.generator import Verifying, codegen
from pipeforge.ir import Placement, Schedule, programs_from_tokens
from pipeforge.passes.lower import lower_with_origins

BROKEN = Schedule("broken", 2, 2, 1, (Placement.loop(2, 2),),
                  programs_from_tokens([["0F0", "0B0"], ["1B0", "1F0"]]))  # rank 1: B before F of microbatch 0


@pytest.fixture
def children(monkeypatch):
    """Write no bytecode and verify every schedule in a child (whatever its size or the threads of the test
    process); the pids of the children started."""
    started: list[int] = []
    fork = generator._verify_in_child

    def noted(*args):
        child, answer = fork(*args)
        started.append(child)
        return child, answer

    monkeypatch.setattr(generator, "BYTECODE_UP_TO", -1)
    monkeypatch.setattr(generator, "VERIFY_APART_FROM", 0)
    monkeypatch.setattr(generator, "_can_fork", lambda: True)
    monkeypatch.setattr(generator, "_verify_in_child", noted)
    return started


def reaped(child: int) -> bool:
    try:
        os.waitpid(child, os.WNOHANG)
    except ChildProcessError:
        return True
    return False


def test_a_schedule_verified_in_a_child_gives_the_same_files(tmp_path, children):
    schedule = load("zbv", defines={"P": 4, "M": 8})
    apart = codegen(schedule, tmp_path / "apart", jobs=1)
    assert len(children) == 1 and reaped(children[0])
    here = codegen(schedule, tmp_path / "here", jobs=0)  # jobs=0: everything in the caller
    assert len(children) == 1
    assert apart.read_bytes() == here.read_bytes()
    folders = [generator.rank_folder(path) for path in (apart, here)]
    assert folders[0].name == folders[1].name
    assert [p.read_bytes() for p in sorted(folders[0].glob("*.py"))] == \
        [p.read_bytes() for p in sorted(folders[1].glob("*.py"))]


def test_an_invalid_schedule_gets_the_report_it_gets_verified_here(tmp_path, children):
    with pytest.raises(VerificationError) as apart:
        codegen(BROKEN, tmp_path / "apart", jobs=1)
    assert len(children) == 1 and reaped(children[0])
    with pytest.raises(VerificationError) as here:
        codegen(BROKEN, tmp_path / "here", jobs=0)
    assert str(apart.value) == str(here.value) and "order" in str(apart.value)
    assert apart.value.report.violations == here.value.report.violations
    assert not (tmp_path / "apart").exists()


def test_a_child_that_dies_leaves_the_verdict_to_the_caller(tmp_path, children, monkeypatch):
    parent, verify, holds = os.getpid(), generator.verify, generator.holds
    calls = []

    def dying(*args, **kwargs):
        if os.getpid() != parent:
            os._exit(3)  # the child dies without an answer
        return holds(*args, **kwargs)

    def counted(*args, **kwargs):
        calls.append(1)
        return verify(*args, **kwargs)

    monkeypatch.setattr(generator, "holds", dying)
    monkeypatch.setattr(generator, "verify", counted)
    path = codegen(load("1f1b", defines={"P": 2, "M": 4}), tmp_path, jobs=1)
    assert path.exists() and calls == [1] and reaped(children[0])  # verified once more, here


def test_a_failure_while_rendering_ends_the_child(tmp_path, children, monkeypatch):
    parent, holds = os.getpid(), generator.holds

    def slow(*args, **kwargs):
        if os.getpid() != parent:
            time.sleep(600)  # still verifying when the caller fails
        return holds(*args, **kwargs)

    def failing(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(generator, "holds", slow)
    monkeypatch.setattr(generator, "render_files", failing)
    with pytest.raises(KeyboardInterrupt):
        codegen(load("1f1b", defines={"P": 2, "M": 4}), tmp_path / "out", jobs=1)
    assert len(children) == 1 and reaped(children[0]) and not (tmp_path / "out").exists()


def test_a_small_schedule_or_a_threaded_caller_verifies_here(monkeypatch):
    schedule = load("1f1b", defines={"P": 2, "M": 4})
    lowered = lower_with_origins(schedule)
    assert lowered.schedule.action_count() < generator.VERIFY_APART_FROM
    with Verifying(schedule, lowered, "rendezvous") as verifying:
        assert verifying.child is None
        verifying.verdict()
    monkeypatch.setattr(generator, "VERIFY_APART_FROM", 0)
    monkeypatch.setattr(generator.threading, "active_count", lambda: 2)  # a fork would copy another's locks
    with Verifying(schedule, lowered, "rendezvous") as verifying:
        assert verifying.child is None
    with Verifying(schedule, lowered, "rendezvous", apart=False) as verifying:
        assert verifying.child is None
