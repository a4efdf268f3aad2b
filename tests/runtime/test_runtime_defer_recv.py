"""Deferred receives (``--defer-recv``) generate and run: the runtime needs no rendezvous.

A deferred schedule is valid under buffered semantics only (a send is posted
before its receive is). The runtime follows that reading: sends never wait for
their peer before the end of a step, the first step's shapes travel just ahead
of the data, and a receive waits only for its matching send to be posted.
"""

from __future__ import annotations

import pytest

import pipeforge
from pipeforge.cli import main
from pipeforge.errors import ArgumentError, VerificationError
from pipeforge.generator import codegen, generate
from pipeforge.passes import defer_recv
from pipeforge.tools.generated import generated_text
from pipeforge.tools.launch import spawn, summarize
from pipeforge.verifier import verify

CASES = [("1f1b", 4, 8), ("interleaved-1f1b", 2, 4), ("zbv", 2, 4)]


def deferred(name: str, ranks: int, microbatches: int):
    return defer_recv(pipeforge.load(name, defines={"P": ranks, "M": microbatches}))


@pytest.mark.parametrize("name, ranks, microbatches", CASES)
def test_deferred_schedules_need_buffered_semantics(name, ranks, microbatches):
    schedule = deferred(name, ranks, microbatches)
    assert verify(schedule, semantics="buffered").valid
    assert not verify(schedule).valid  # so codegen must verify it under buffered, as --defer-recv says
    with pytest.raises(VerificationError, match="deadlock"):
        generate(schedule)
    assert "def rank_0" in generate(schedule, semantics="buffered")


def test_generate_refuses_a_semantics_the_runtime_does_not_follow():
    with pytest.raises(ArgumentError, match="semantics='nccl'"):
        generate(pipeforge.load("1f1b", defines={"P": 2, "M": 2}), semantics="nccl")


def test_codegen_accepts_deferred_receives(tmp_path, capsys):
    assert main(["codegen", "1f1b", "-D", "P=2", "-D", "M=4", "--defer-recv", "-o", str(tmp_path)]) == 0
    text = generated_text(tmp_path / "one_f_one_b.py")
    # every receive is its own step, right before the forward that consumes it
    assert "    post('1RECV_F2')  # 1RECV_F2" in text
    assert text.index("    post('1RECV_F2')") < text.index("    forward(1, 2)")


def run_jobs(rank: int, nproc: int, jobs: list[dict]) -> list[dict]:
    from pipeforge.tools.reference_check import CheckJob, check_rank

    return [check_rank(rank, nproc, CheckJob(**job)) for job in jobs]


@pytest.mark.distributed
@pytest.mark.timeout(300)
@pytest.mark.parametrize("ranks", [2, 4])
def test_deferred_schedules_equal_the_unpipelined_model(ranks, tmp_path):
    cases = [case for case in CASES if case[1] == ranks]
    jobs = []
    for name, _, microbatches in cases:
        path = codegen(deferred(name, ranks, microbatches), tmp_path / name, semantics="buffered")
        jobs += [{"module_path": str(path), "model": model, "timeout": 30.0, "steps": 3} for model in ("mlp", "tuple")]
    outcomes = spawn(run_jobs, ranks, jobs, timeout=30, deadline=240)
    assert all(o.ok for o in outcomes), "\n".join(o.error for o in outcomes if not o.ok)
    for index, job in enumerate(jobs):
        verdict = summarize([o.value[index] for o in outcomes])
        assert verdict["match"] and verdict["max_abs_diff"] == 0.0, (job, verdict)


@pytest.mark.distributed
@pytest.mark.timeout(300)
def test_run_with_deferred_receives_matches_the_unpipelined_model(capsys):
    assert main(["run", "interleaved-1f1b", "-D", "P=2", "-D", "M=4", "--defer-recv", "--json",
                 "--timeout", "60"]) == 0
