"""Chrome / Perfetto trace JSON of a simulated schedule (open it in ui.perfetto.dev or chrome://tracing).

One process (pid 0, named after the schedule), one thread per rank (tid = rank;
a rank's copy lane, where OFFLOAD and RELOAD run, tid = ranks + rank), one
complete event (``"ph": "X"``) per compute action, named by its torch token
(``2F0``) with its stage, microbatch, chain and program step in ``args``, and
per rank a counter ``rank r memory`` (``"ph": "C"``, ``args.M_B``) at every
change of what it holds (``Timeline.memory_curves``, the HTML page's curve). One
unit of cost is written as one millisecond (trace times are in microseconds).
"""

from __future__ import annotations

import json

from pipeforge.files import write_atomically
from pipeforge.ir import CostModel, Schedule
from pipeforge.sim import simulate
from pipeforge.sim.simulate import Timeline

MICROSECONDS_PER_UNIT = 1000.0


def trace_events(timeline: Timeline) -> list[dict]:
    """Metadata events naming the process and the ranks, one X event per action, the memory counters."""
    events: list[dict] = [{"name": "process_name", "ph": "M", "pid": 0, "tid": 0,
                           "args": {"name": f"pipeforge {timeline.name}"}}]
    for rank in range(timeline.ranks):
        events.append({"name": "thread_name", "ph": "M", "pid": 0, "tid": rank, "args": {"name": f"rank {rank}"}})
        events.append({"name": "thread_sort_index", "ph": "M", "pid": 0, "tid": rank, "args": {"sort_index": rank}})
    for rank in sorted({e.rank for e in timeline.events if e.lane == "copy"}):
        tid = timeline.ranks + rank
        events.append({"name": "thread_name", "ph": "M", "pid": 0, "tid": tid, "args": {"name": f"rank {rank} copy"}})
        events.append({"name": "thread_sort_index", "ph": "M", "pid": 0, "tid": tid,
                       "args": {"sort_index": tid}})
    for event in timeline.events:
        for action, start, end in event.action_spans():
            events.append(_action_event(action, event, start, end, timeline.ranks))
    for rank, curve in enumerate(timeline.memory_curves):
        events += [{"name": f"rank {rank} memory", "ph": "C", "pid": 0, "ts": time * MICROSECONDS_PER_UNIT,
                    "args": {"M_B": held}} for time, held in curve]
    return events


def _action_event(action, event, start: float, end: float, ranks: int = 0) -> dict:
    return {
        "name": str(action),
        "cat": action.kind.value,
        "ph": "X",
        "pid": 0,
        "tid": event.rank if event.lane == "compute" else ranks + event.rank,
        "ts": start * MICROSECONDS_PER_UNIT,
        "dur": (end - start) * MICROSECONDS_PER_UNIT,
        "args": {"stage": action.stage, "microbatch": action.microbatch, "chain": action.chain,
                 "kind": action.kind.value, "step": event.step, "overlap": len(event.actions) > 1},
    }


def trace_document(timeline: Timeline) -> dict:
    summary = timeline.to_json()
    summary.pop("ranks", None)
    summary.pop("bounds", None)
    return {"traceEvents": trace_events(timeline), "displayTimeUnit": "ms", "otherData": summary}


def trace_text(schedule_or_timeline: Schedule | Timeline, costs: CostModel | None = None) -> str:
    return json.dumps(trace_document(_timeline(schedule_or_timeline, costs)), indent=1) + "\n"


def write_trace(schedule_or_timeline: Schedule | Timeline, path: str, costs: CostModel | None = None) -> None:
    """Simulate (if given a Schedule, on ``costs``) and write the trace to ``path`` atomically."""
    write_atomically(path, trace_text(schedule_or_timeline, costs))


def _timeline(schedule_or_timeline: Schedule | Timeline, costs: CostModel | None) -> Timeline:
    if isinstance(schedule_or_timeline, Timeline):
        return schedule_or_timeline
    return simulate(schedule_or_timeline, costs)
