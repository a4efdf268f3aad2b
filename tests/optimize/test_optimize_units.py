"""The optimizer does not depend on the unit of the costs: integer units, and scaling properties."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeforge.ir import CostModel, Placement
from pipeforge.optimizer import optimize
from pipeforge.optimizer.evaluate import Problem
from pipeforge.optimizer.greedy import zero_bubble_orders
from pipeforge.optimizer.list_schedule import list_schedule_orders
from pipeforge.optimizer.units import GRID, integer_units
from tests.optimize.opt_instances import make_schedule, one_f_one_b

ARXIV_14B = (11.347, 11.248, 8.132, 0.377)  # the Zero Bubble paper's 14.6B profile, ms


def scaled(values, factor: float) -> CostModel:
    f, i, w, comm = (v * factor for v in values)
    return CostModel(F=f, I=i, W=w, comm=comm)


@pytest.mark.parametrize("factor", [1.0, 1000.0, 0.001, 1e-6, 3.0, 1 / 7])
def test_a_profile_in_any_unit_becomes_the_same_integers(factor):
    units = integer_units(scaled(ARXIV_14B, factor))
    costs = units.costs
    assert (costs.F, costs.I, costs.W, costs.comm) == (11347, 11248, 8132, 377)
    assert units.scale == pytest.approx(0.001 * factor)


def test_costs_with_many_digits_are_rounded_to_a_fine_grid():
    units = integer_units(CostModel(F=1.0, I=0.123456789123, W=0.987654321987, comm=0.0))
    assert units.costs.F == GRID
    assert units.costs.I == round(0.123456789123 * GRID)
    assert all(float(v).is_integer() for v in (units.costs.I, units.costs.W, units.costs.comm))


def test_per_stage_costs_and_b_are_scaled_with_the_rest():
    units = integer_units(CostModel(F=0.5, I=0.25, W=0.25, B=0.75, comm=0.125, per_stage=((1, "F", 1.0),)))
    assert (units.costs.F, units.costs.I, units.costs.B, units.costs.comm) == (4, 2, 6, 1)
    assert units.costs.per_stage == ((1, "F", 8.0),)
    assert units.scale == 0.125


def test_zero_costs_stay_as_they_are():
    units = integer_units(CostModel(F=0.0, I=0.0, W=0.0))
    assert units.scale == 1.0


def zero_bubble_problem(p, m, costs, limit, weights):
    return Problem(p, p, m, (Placement.loop(p, p),), costs, limit, weights)


def test_milliseconds_and_microseconds_give_the_same_zero_bubble_orders():
    # Before integer units, 270 of these 300 differed between ms and µs (ties settled by ~1e-13 of rounding).
    rng = random.Random(1)
    for _ in range(40):
        p = rng.choice([4, 8])
        m = rng.choice([2 * p, 3 * p])
        values = [round(rng.uniform(5, 30), 3) for _ in range(3)] + [round(rng.uniform(0, 1), 3)]
        limit, weights = rng.choice([1, 1.25, 1.375, 1.5, 2]) * p, rng.choice([0.5, 0.432, 0.366])
        ms, us = (zero_bubble_orders(zero_bubble_problem(p, m, scaled(values, f), limit, weights))
                  for f in (1.0, 1000.0))
        assert [(o.knobs, o.keys, o.ticks) for o in ms] == [(o.knobs, o.keys, o.ticks) for o in us]


@settings(max_examples=25, deadline=None)
@given(values=st.tuples(st.floats(0.1, 50), st.floats(0.1, 50), st.floats(0.1, 50), st.floats(0, 5)),
       factor=st.floats(1e-4, 1e4), p=st.integers(2, 5), extra=st.integers(0, 6),
       limit=st.sampled_from([1.0, 1.5, 2.0]), weights=st.sampled_from([0.5, 0.366]))
def test_scaling_every_cost_gives_the_same_schedule_and_bubble_rate(values, factor, p, extra, limit, weights):
    m = p + extra
    schedule = make_schedule(p, m, one_f_one_b(p, m))
    results = [optimize(schedule, costs=scaled(values, f), memory_limit=limit * p, strategy="greedy")
               for f in (1.0, factor)]
    assert results[0].schedule.programs == results[1].schedule.programs
    assert results[0].after.bubble_rate == pytest.approx(results[1].after.bubble_rate, rel=1e-9, abs=1e-12)
    assert results[0].bound == pytest.approx(results[1].bound, rel=1e-9, abs=1e-12)
    assert results[1].after.max_span == pytest.approx(results[0].after.max_span * factor, rel=1e-9)


@settings(max_examples=15, deadline=None)
@given(values=st.tuples(st.floats(0.1, 50), st.floats(0.1, 50), st.floats(0.1, 50), st.floats(0, 5)),
       factor=st.floats(1e-4, 1e4), p=st.integers(2, 4), extra=st.integers(0, 4))
def test_list_scheduling_on_a_v_placement_does_not_depend_on_units(values, factor, p, extra):
    m = p + extra
    placement = Placement.v(2 * p, p)
    problem = [Problem(p, 2 * p, m, (placement,), scaled(values, f), 2.0 * p, 0.5) for f in (1.0, factor)]
    assert list_schedule_orders(problem[0]) == list_schedule_orders(problem[1])


def test_per_link_latencies_are_scaled_with_the_rest():
    units = integer_units(CostModel(F=0.5, I=0.25, W=0.25, comm=0.125, links=(0.25, 0.5)))
    assert units.costs.links == (2.0, 4.0) and units.costs.comm == 1.0
