"""Simulation of a schedule on a cost model: a Timeline with makespan, bubble rate, memory and bounds.

    from pipeforge.sim import simulate
    timeline = simulate(schedule)                 # unit costs unless the schedule has its own
    timeline.makespan, timeline.bubble_rate, timeline.peak_memory, timeline.lower_bound
"""

from pipeforge.sim.bounds import Bounds, RankBound, WorkBound, compute_bounds, work_bound
from pipeforge.sim.costs import parse_cost_flag, resolve_costs
from pipeforge.sim.simulate import Event, RankStats, Timeline, simulate
from pipeforge.sim.workgraph import WorkGraph, compile_actions, compile_schedule, time_order

__all__ = ["Bounds", "Event", "RankBound", "RankStats", "Timeline", "WorkBound", "WorkGraph", "compile_actions",
           "compile_schedule", "compute_bounds", "parse_cost_flag", "resolve_costs", "simulate", "time_order",
           "work_bound"]
