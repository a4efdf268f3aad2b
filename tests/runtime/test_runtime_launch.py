"""The local launcher: every rank reports, errors come back as text, a stuck rank is killed at the deadline."""

from __future__ import annotations

import time

import pytest

from pipeforge.tools.launch import free_port, resolve_backend, spawn, summarize
from tests.load import scaled

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(120)]


def world(rank: int, nproc: int, payload: str) -> tuple:
    import torch.distributed as dist

    return rank, dist.get_world_size(), dist.get_backend(), payload


def fail_on_one(rank: int, nproc: int, payload: None) -> int:
    if rank == 1:
        raise ValueError("rank one refuses")
    return rank


def stuck(rank: int, nproc: int, payload: None) -> None:
    time.sleep(60)


def test_every_rank_runs_in_one_gloo_group():
    outcomes = spawn(world, 3, "hello", timeout=scaled(20))
    assert [o.value for o in outcomes] == [(r, 3, "gloo", "hello") for r in range(3)]


def test_a_worker_named_by_string():
    outcomes = spawn("pipeforge.tools.launch:free_port", 1, timeout=scaled(20))
    assert outcomes[0].ok is False and "free_port() takes 0 positional arguments" in outcomes[0].error


def test_a_failing_rank_reports_its_error():
    outcomes = spawn(fail_on_one, 2, timeout=scaled(10), deadline=40)
    assert outcomes[0].ok and outcomes[0].value == 0
    assert not outcomes[1].ok and "ValueError: rank one refuses" in outcomes[1].error


def test_a_stuck_rank_is_killed_at_the_deadline():
    started = time.monotonic()
    outcomes = spawn(stuck, 2, timeout=scaled(5), deadline=4)  # stuck for 60 s: killed at 4 s times the scale
    assert time.monotonic() - started < scaled(20)
    assert all(not o.ok and "deadline" in o.error for o in outcomes)


def test_helpers():
    assert 0 < free_port() < 65536
    assert resolve_backend("gloo", 8) == "gloo"
    verdict = summarize([{"match": True, "max_abs_diff": 0.0, "max_rel_diff": 0.0, "worst": "", "missing": []},
                         {"match": False, "max_abs_diff": 1.0, "max_rel_diff": 0.5, "worst": "x", "missing": ["y"]}])
    assert verdict == {"match": False, "max_abs_diff": 1.0, "max_rel_diff": 0.5, "worst": "x", "missing": ["y"]}


def staged_exchange(rank: int, nproc: int, payload: None) -> list:
    """Two ranks swap tensors through host staging (the path gloo takes for CUDA tensors)."""
    import torch

    from pipeforge.runtime.p2p import Transfer, Transport

    transport = Transport(None, rank, None, torch.device("cpu"))
    transport.staged = True
    mine = torch.full((3,), float(rank + 1))
    theirs = torch.zeros(3)
    posted = transport.post([Transfer(True, mine, 1 - rank), Transfer(False, theirs, 1 - rank)], "swap")
    posted.wait()
    return theirs.tolist()


def test_host_staging_delivers_into_the_device_buffer():
    outcomes = spawn(staged_exchange, 2, timeout=20)
    assert [o.value for o in outcomes] == [[2.0, 2.0, 2.0], [1.0, 1.0, 1.0]]
