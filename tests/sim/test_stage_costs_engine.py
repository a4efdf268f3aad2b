"""Per-link latency and per-stage memory through the one timing engine: simulate, bounds, optimize."""

from __future__ import annotations

from dataclasses import replace

import pytest

from pipeforge.ir import CostModel, MemorySpec
from pipeforge.library import load_library_schedule
from pipeforge.optimizer import optimize
from pipeforge.optimizer.placement import chunk_costs
from pipeforge.optimizer.units import integer_units
from pipeforge.sim import simulate


def _1f1b(**defines):
    return load_library_schedule("1f1b", defines or {"P": 4, "M": 8})


def test_a_link_latency_is_the_uniform_comm_on_that_link():
    schedule = _1f1b(P=2, M=4)
    by_link = simulate(schedule, CostModel(links=(0.5,)))
    uniform = simulate(schedule, CostModel(comm=0.5))
    assert by_link.makespan == uniform.makespan > simulate(schedule, CostModel()).makespan


def test_only_the_slow_link_costs():
    schedule = _1f1b()
    slow_last = simulate(schedule, CostModel(links=(0.0, 0.0, 2.0))).makespan
    slow_all = simulate(schedule, CostModel(comm=2.0)).makespan
    assert simulate(schedule, CostModel()).makespan < slow_last < slow_all


def test_peak_memory_counts_each_stage_activation():
    memory = MemorySpec(activation=(1.0, 0.5, 0.5, 0.8))
    timeline = simulate(_1f1b(), memory=memory)
    assert timeline.peak_memory == pytest.approx([4.0, 1.5, 1.0, 0.8])


def test_bounds_stay_below_the_makespan_with_small_stage_activations():
    schedule = load_library_schedule("zb-h1", {"P": 4, "M": 8})
    memory = MemorySpec(limit=2.0, activation=(0.25, 0.25, 0.25, 0.25), weight_grad=(0.1, 0.1, 0.1, 0.1))
    timeline = simulate(schedule, memory=memory)
    assert max(timeline.peak_memory) <= 2.0
    assert timeline.bounds.makespan <= timeline.makespan + 1e-9
    result = optimize(replace(schedule, memory=memory), memory_limit=2.0, strategy="greedy", time_limit=2.0)
    assert result.span_bound <= max(s.span for s in timeline.rank_stats) + 1e-9


def test_optimize_keeps_the_per_stage_memory_limit():
    memory = MemorySpec(activation=(1.0, 0.5, 0.5, 1.0), weight_grad=(0.5, 0.25, 0.25, 0.5))
    costs = CostModel(per_stage=((0, "F", 2.0), (0, "I", 2.0), (0, "W", 2.0), (3, "F", 2.0), (3, "I", 2.0),
                                 (3, "W", 2.0)), links=(0.1, 0.2, 0.3))
    schedule = replace(_1f1b(), memory=memory, costs=costs)
    result = optimize(schedule, memory_limit=4.0, strategy="greedy", time_limit=2.0)
    after = simulate(result.schedule, costs, memory=replace(memory, limit=4.0))
    assert max(after.peak_memory) <= 4.0 + 1e-9
    assert after.makespan <= simulate(schedule, costs, memory=memory).makespan + 1e-9
    assert result.schedule.memory.activation == memory.activation


def test_chunks_keep_each_link_at_the_end_of_its_stage():
    costs = chunk_costs(CostModel(comm=0.1, links=(1.0, 2.0)), 2)
    assert costs.links == (0.1, 1.0, 0.1, 2.0)
    assert costs.latency(1, 2) == 1.0 and costs.latency(0, 1) == 0.1


def test_integer_units_scale_links_with_the_rest():
    units = integer_units(CostModel(F=0.5, I=0.5, W=0.25, links=(0.125,)))
    assert units.costs.links[0] * units.scale == pytest.approx(0.125)
    assert float(units.costs.links[0]).is_integer()
