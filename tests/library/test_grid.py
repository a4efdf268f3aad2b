"""Every library schedule over a grid of parameters: it elaborates (or its `require` refuses
with a located error), holds every compute action exactly once on the rank that owns it,
verifies, and its canonical print reads back to the same schedule.
"""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pipeforge
from pipeforge import library
from pipeforge.errors import SemanticError
from pipeforge.ir import ActionKind, Schedule
from pipeforge.lang.printer import print_schedule
from pipeforge.verifier import verify

F, B, I, W = ActionKind.F, ActionKind.B, ActionKind.I, ActionKind.W


def grid(name: str) -> list[dict[str, int]]:
    takes_v = "V" in dict(library.describe(name)[1])
    points = []
    for ranks in (1, 2, 3, 4, 5, 8):
        for microbatches in sorted({1, 2, ranks - 1, ranks, ranks + 1, 2 * ranks - 1, 2 * ranks, 3 * ranks} - {0}):
            for per_rank in ((1, 2, 3) if takes_v else (None,)):
                point = {"P": ranks, "M": microbatches}
                if per_rank:
                    point["V"] = per_rank
                points.append(point)
    return points


def elaborate_or_refuse(name: str, defines: dict[str, int]) -> Schedule | None:
    """The schedule, or None when a `require` of the file refuses these parameters."""
    try:
        return library.load_library_schedule(name, defines)
    except SemanticError as refused:
        assert refused.span is not None and refused.span.file.endswith(f"{name}.pipe")
        return None


def completeness_problems(schedule: Schedule) -> list[str]:
    """Each (chain, stage, microbatch): one F, and one B or one I and one W, on the owning rank."""
    counts: Counter = Counter()
    chain_of: dict[int, set[int]] = {}
    problems = []
    for rank, _, action in schedule.actions():
        if not action.is_compute:
            continue
        if schedule.rank_of(action.stage, action.chain) != rank:
            problems.append(f"{action} on rank {rank}, not its owner")
        counts[(action.chain, action.stage, action.microbatch, action.kind)] += 1
        chain_of.setdefault(action.microbatch, set()).add(action.chain)
    for microbatch in range(schedule.microbatches):
        chains = chain_of.get(microbatch, set())
        if len(chains) != 1:
            problems.append(f"microbatch {microbatch} runs on chains {sorted(chains)}")
            continue
        chain = chains.pop()
        for stage in range(schedule.stages):
            seen = {kind: counts[(chain, stage, microbatch, kind)] for kind in (F, B, I, W)}
            if seen[F] != 1 or (seen[B], seen[I], seen[W]) not in ((1, 0, 0), (0, 1, 1)):
                problems.append(f"stage {stage} microbatch {microbatch}: {seen}")
    extra = set(chain_of) - set(range(schedule.microbatches))
    problems += [f"microbatch {m} does not exist" for m in sorted(extra)]
    return problems


def check(schedule: Schedule) -> None:
    assert completeness_problems(schedule) == []
    report = verify(schedule, certify=False)
    assert report.valid, [v.message for v in report.violations]
    assert pipeforge.loads(print_schedule(schedule)) == schedule


CASES = [(name, point) for name in library.names() for point in grid(name)]


@pytest.mark.parametrize("name,defines", CASES, ids=[f"{n}-{'-'.join(f'{k}{v}' for k, v in d.items())}" for n, d in CASES])
def test_library_schedule_over_the_grid(name, defines):
    schedule = elaborate_or_refuse(name, defines)
    if schedule is None:
        pytest.skip(f"{name} requires otherwise: {defines}")
    check(schedule)


@pytest.mark.parametrize("name", library.names())
def test_defaults_elaborate_and_certify(name):
    schedule = library.load_library_schedule(name)
    check(schedule)
    assert verify(schedule).certified


def test_completeness_check_catches_a_missing_and_a_misplaced_action():
    from dataclasses import replace

    schedule = library.load_library_schedule("1f1b", {"P": 2, "M": 2})
    rank0, rank1 = schedule.programs
    dropped = replace(schedule, programs=(rank0[1:], rank1))
    assert any("stage 0 microbatch 0" in p for p in completeness_problems(dropped))
    moved = replace(schedule, programs=(rank0 + rank1[:1], rank1[1:]))
    assert any("not its owner" in p for p in completeness_problems(moved))


@pytest.mark.parametrize("name", library.names())
@settings(max_examples=15, deadline=None)
@given(ranks=st.integers(1, 7), microbatches=st.integers(1, 24), per_rank=st.integers(1, 4))
def test_any_accepted_parameters_give_a_complete_valid_schedule(name, ranks, microbatches, per_rank):
    defines = {"P": ranks, "M": microbatches}
    if "V" in dict(library.describe(name)[1]):
        defines["V"] = per_rank
    schedule = elaborate_or_refuse(name, defines)
    if schedule is not None:
        assert (schedule.ranks, schedule.microbatches) == (ranks, microbatches)
        check(schedule)
