"""Gathered parameters in simulate's peak memory: the same rule and the same walk as verify's.

With ``memory { unsharded = X }`` an UNSHARD holds X (M_B) until its RESHARD
(``semantics.PARAMETER_MEMORY``, through ``semantics.stage_effect``). verify
reports ``memory`` exactly when simulate's peak of some rank is over the limit:
checked on the library schedules through the ``unshard`` pass (worked peaks in
a table) and on random valid schedules with UNSHARD/RESHARD (hypothesis).
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import pipeforge
import pipeforge.testing as pt
from pipeforge.ir import MemorySpec, Placement, Schedule, format_grid, programs_from_tokens
from pipeforge.passes import PassOptions, apply_passes, reduce_grad, unshard
from pipeforge.sim import simulate
from pipeforge.verifier import verify

FAST = settings(max_examples=80, deadline=None, suppress_health_check=list(HealthCheck), database=None)


def with_unshard(name: str, max_active: int, unsharded: float, lower: bool = False) -> Schedule:
    schedule = pipeforge.load(name, defines={"P": 2, "M": 4})
    schedule = apply_passes(schedule, PassOptions(unshard=max_active, reduce_grad=True), lower=lower)
    return replace(schedule, memory=MemorySpec(unsharded=unsharded))


def memory_ranks(schedule: Schedule, limit: float) -> set[int]:
    """The ranks verify finds over ``limit`` (the memory violations only)."""
    return {v.rank for v in verify(schedule, memory_limit=limit).violations if v.kind == "memory"}


def assert_verify_agrees(schedule: Schedule) -> None:
    """verify's memory verdict at simulate's peak (fits) and just under it (the ranks at the peak fail)."""
    peaks = simulate(schedule).peak_memory
    top = max(peaks)
    assert memory_ranks(schedule, top) == set(), format_grid(schedule)
    below = top - 1 / 64
    assert memory_ranks(schedule, below) == {r for r, p in enumerate(peaks) if p > below + 1e-9}, format_grid(schedule)


# (schedule, max_active_stages, unsharded, each rank's peak); P = 2, M = 4, weights 0.5 (B releases 1)
PEAKS = [
    ("1f1b", 1, 0.0, (2.0, 1.0)),        # 1F1B: P - r activations
    ("1f1b", 1, 0.5, (2.5, 1.5)),        # one stage per rank, gathered throughout
    ("1f1b", 1, 2.0, (4.0, 3.0)),
    ("interleaved-1f1b", 1, 0.5, (5.5, 3.5)),   # one of the rank's two stages gathered at a time
    ("interleaved-1f1b", 2, 0.5, (6.0, 4.0)),   # both gathered at the peak
    ("zbv", 1, 0.5, (4.5, 4.5)),
    ("zbv", 2, 0.5, (5.0, 5.0)),
]


@pytest.mark.parametrize("name, max_active, unsharded, peaks", PEAKS)
def test_simulate_counts_gathered_parameters(name, max_active, unsharded, peaks):
    schedule = with_unshard(name, max_active, unsharded)
    assert simulate(schedule).peak_memory == peaks
    assert_verify_agrees(schedule)


@pytest.mark.parametrize("name, max_active, unsharded, peaks", PEAKS[1::2])
def test_lowered_schedules_have_the_same_peak(name, max_active, unsharded, peaks):
    assert simulate(with_unshard(name, max_active, unsharded, lower=True)).peak_memory == peaks


def test_without_a_size_or_without_unshard_the_peak_is_the_activations():
    plain = pipeforge.load("interleaved-1f1b", defines={"P": 2, "M": 4})
    activations = simulate(plain).peak_memory
    assert simulate(with_unshard("interleaved-1f1b", 1, 0.0)).peak_memory == activations
    assert simulate(replace(plain, memory=MemorySpec(unsharded=3.0))).peak_memory == activations


def test_an_overlap_step_counts_its_additions_first():
    rows = [["0UNSHARD", "0F0", "(0F1;0B0)", "0B1", "0RESHARD"]]
    schedule = Schedule("o", 1, 1, 2, (Placement((0,)),), programs_from_tokens(rows),
                        memory=MemorySpec(unsharded=0.5))
    # 0.5 gathered + 0F0 + 0F1 before the overlap step releases 0B0's activation
    assert simulate(schedule).peak_memory == (2.5,)
    assert_verify_agrees(schedule)


@FAST
@given(st.data(), st.sampled_from([0.25, 0.5, 1.0]), st.booleans())
def test_verify_and_simulate_agree_on_random_schedules_with_unshard(data, unsharded, stage_sizes):
    schedule = data.draw(pt.schedules(max_ranks=3, max_stages_per_rank=2, max_microbatches=3,
                                      comms=data.draw(st.sampled_from([None, "lower"]))))
    schedule = unshard(schedule, data.draw(st.integers(1, 3)))
    if data.draw(st.booleans()):
        schedule = reduce_grad(schedule)
    memory = MemorySpec(weights=0.5, unsharded=unsharded)
    if stage_sizes:
        sizes = data.draw(st.lists(st.sampled_from([0.5, 1.0, 2.0]), min_size=schedule.stages,
                                   max_size=schedule.stages))
        memory = replace(memory, activation=tuple(sizes))
    assert_verify_agrees(replace(schedule, memory=memory))


def test_simulate_and_verify_commands_agree_on_a_file_with_unsharded(tmp_path, capsys):
    from pipeforge.cli import main
    from pipeforge.lang.printer import print_schedule

    path = tmp_path / "sharded.pipe"
    path.write_text(print_schedule(with_unshard("1f1b", 1, 0.5)), encoding="utf-8")
    assert main(["simulate", str(path), "--memory-limit", "2.25"]) == 0
    assert "r0: 2.5  r1: 1.5  (M_B; limit 2.25: OVER)" in capsys.readouterr().out
    assert main(["verify", str(path), "--memory-limit", "2.25"]) != 0
    assert "rank 0 holds 2.5 microbatches of activations and unsharded parameters" in capsys.readouterr().out
    assert main(["verify", str(path), "--memory-limit", "2.5"]) == 0
