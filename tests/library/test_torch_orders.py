"""The library's schedules against the orders torch 2.13 builds, on every case of torch's own tests.

Each library schedule with a torch twin must issue, on every rank, exactly the
compute actions torch's ``pipeline_order`` lists, in the same order (idle slots
and REDUCE_GRAD aside). Cases torch refuses are skipped with torch's reason.
The one place torch is wrong (Schedule1F1B's last rank) is compared with the
correct 1F1B instead, and torch's order is shown to fail verification.
"""

from __future__ import annotations

import pytest

from pipeforge import library
from pipeforge.ir import Action, ActionKind, Step
from pipeforge.verifier import verify
from tests.library.torch_orders import (
    TORCH_TEST_CASES, TORCH_TWINS, compute_programs, torch_cases, torch_programs, torch_schedule,
)

LARGE = 4096  # ranks x microbatches x stages per rank above which a case is marked slow (the fast tier skips it)


def case_param(*case):
    return pytest.param(*case, marks=pytest.mark.slow) if case[1] * case[2] * case[3] > LARGE else case


CASES = [case_param(name, *case) for name in TORCH_TWINS for case in torch_cases(name)]


def library_defines(name: str, ranks: int, microbatches: int, per_rank: int) -> dict[str, int]:
    defines = {"P": ranks, "M": microbatches}
    if "V" in dict(library.describe(name)[1]):
        defines["V"] = per_rank
    return defines


def torch_or_skip(name: str, ranks: int, microbatches: int, per_rank: int):
    torch_class, _ = TORCH_TWINS[name]
    try:
        return torch_programs(torch_class, ranks, microbatches, per_rank)
    except (ValueError, AssertionError) as refused:
        pytest.skip(f"torch {torch_class} refuses P={ranks} M={microbatches} V={per_rank}: {refused}")


def first_difference(mine: tuple[Step, ...], theirs: tuple[Step, ...]) -> str:
    for index, (a, b) in enumerate(zip(mine, theirs)):
        if a != b:
            return f"step {index}: library {a}, torch {b}"
    return f"lengths: library {len(mine)}, torch {len(theirs)}"


@pytest.mark.parametrize("name,ranks,microbatches,per_rank", CASES)
def test_library_order_equals_torch(name, ranks, microbatches, per_rank):
    theirs = torch_or_skip(name, ranks, microbatches, per_rank)
    mine = compute_programs(library.load_library_schedule(name, library_defines(name, ranks, microbatches, per_rank)))
    # torch's 1F1B is wrong on its last rank (see below): compare the others there
    compared = range(ranks - 1) if name == "1f1b" else range(ranks)
    for rank in compared:
        assert mine[rank] == theirs[rank], f"rank {rank}: {first_difference(mine[rank], theirs[rank])}"


def one_f_one_b_last_rank(ranks: int, microbatches: int) -> tuple[Step, ...]:
    """The last rank of a correct 1F1B: F m then B m for every microbatch in turn."""
    stage = ranks - 1
    return tuple(Step((Action(stage, kind, m),)) for m in range(microbatches) for kind in (ActionKind.F, ActionKind.B))


@pytest.mark.parametrize("ranks,microbatches", [(2, 2), (2, 8), (4, 4), (4, 8), (4, 16), (8, 8), (5, 10)])
def test_last_rank_of_1f1b_is_correct_where_torch_is_not(ranks, microbatches):
    mine = compute_programs(library.load_library_schedule("1f1b", {"P": ranks, "M": microbatches}))
    assert mine[ranks - 1] == one_f_one_b_last_rank(ranks, microbatches)
    theirs = torch_programs("Schedule1F1B", ranks, microbatches, 1)[ranks - 1]
    forwarded = {step.actions[0].microbatch for step in theirs if step.actions[0].kind is ActionKind.F}
    # torch 2.13 never forwards microbatch 0 on the last rank, and forwards a microbatch M that does not exist
    assert 0 not in forwarded
    assert microbatches in forwarded


@pytest.mark.parametrize("ranks,microbatches", [(2, 2), (4, 8), (8, 16)])
def test_torch_1f1b_order_fails_verification(ranks, microbatches):
    report = verify(torch_schedule("Schedule1F1B", ranks, microbatches, 1))
    assert not report.valid
    kinds = {violation.kind for violation in report.violations}
    assert {"placement", "missing"} <= kinds
    assert verify(library.load_library_schedule("1f1b", {"P": ranks, "M": microbatches})).valid


@pytest.mark.parametrize("name,ranks,microbatches,per_rank", [
    (name, *case) for name in TORCH_TWINS if name != "1f1b" for case in torch_cases(name)
    if case[0] * case[1] * case[2] <= LARGE
])
def test_torch_orders_the_library_matches_are_valid(name, ranks, microbatches, per_rank):
    torch_or_skip(name, ranks, microbatches, per_rank)
    schedule = library.load_library_schedule(name, library_defines(name, ranks, microbatches, per_rank))
    report = verify(schedule, certify=False)
    assert report.valid, [v.message for v in report.violations]


@pytest.mark.parametrize("ranks,microbatches", [
    pytest.param(p, m, marks=pytest.mark.slow) if p * m > LARGE else (p, m)
    for p, m in sorted({(p, m) for _, m, p in TORCH_TEST_CASES})
])
def test_zb_h1_is_torch_zero_bubble_with_one_stage_per_rank(ranks, microbatches):
    # ZB1P with V = 1 is ZB-H1: 1F1B's warm-up, rank r's W passes held back r steps
    try:
        theirs = torch_programs("ScheduleInterleavedZeroBubble", ranks, microbatches, 1)
    except ValueError as refused:
        pytest.skip(f"torch refuses P={ranks} M={microbatches}: {refused}")
    assert compute_programs(library.load_library_schedule("zb-h1", {"P": ranks, "M": microbatches})) == theirs
