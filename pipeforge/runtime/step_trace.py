"""The step trace: opt-in per-action timings of a pipeline's steps, what the rank actually did, and when.

``pipeline.trace = True`` (off by default) makes every later ``step``/``eval`` record a ``Trace`` in
``pipeline.last_trace``: one ``TraceEvent(kind, stage, microbatch, chain, start, end, cpu, label)`` per
compute action (from its inputs in hand to its end), per wait for a receive (``RECV_F``, ``RECV_B``), per
posted group (``post``), the final wait for sends (``finish``), the program and the whole call
(``step``); ``start``/``end`` in ``time.perf_counter()`` seconds (one clock for a machine's processes),
``cpu`` the calling thread's CPU time. ``Tracer`` is the observer that records them. ``compute_costs``
gives a cost file's per-stage medians, ``chrome_events`` a Chrome/Perfetto view. ``docs/runtime.md``.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Iterable
from typing import Any, NamedTuple

from pipeforge.semantics import compute_kind_names

COMPUTE = compute_kind_names()  # the compute kinds (semantics)


class TraceEvent(NamedTuple):
    kind: str  # F, B, I, W, RECV_F, RECV_B, post, finish, program, step
    stage: int | None
    microbatch: int | None
    chain: int
    start: float  # perf_counter seconds
    end: float
    cpu: float  # CPU seconds of the calling thread during the event
    label: str = ""

    @property
    def duration(self) -> float:
        return self.end - self.start

    def to_json(self) -> dict:
        return {"kind": self.kind, "stage": self.stage, "microbatch": self.microbatch, "chain": self.chain,
                "start": self.start, "end": self.end, "cpu": self.cpu, "label": self.label}


class Tracer:
    """An observer of the rank context (``pipeforge.runtime.context.Observer``) recording a ``TraceEvent``
    per compute, wait, post, the final wait and the program."""

    def __init__(self) -> None:
        self.events: list[TraceEvent] = []
        self._computes: list[list[float]] = []  # the running computes' (wall, cpu) starts, innermost last
        self._program: tuple[float, float] | None = None
        self._wait: tuple[float, float] = (0.0, 0.0)
        self._post: tuple[float, float] = (0.0, 0.0)
        self._finish: tuple[float, float] = (0.0, 0.0)
        self._note = ""  # the running compute's note (annotate), its event's label

    def begin_program(self) -> None:
        self._program = (time.perf_counter(), time.thread_time())

    def begin_compute(self, kind: str, stage: int, mb: int, chain: int) -> None:
        self._computes.append([time.perf_counter(), time.thread_time()])

    def end_compute(self, kind: str, stage: int, mb: int, chain: int) -> None:
        started, cpu_started = self._computes.pop()
        self.events.append(TraceEvent(kind, stage, mb, chain, started, time.perf_counter(),
                                      time.thread_time() - cpu_started, self._note))
        self._note = ""

    def annotate(self, note: str) -> None:
        self._note = note

    def begin_wait(self, kind: Any, stage: int, mb: int, chain: int) -> None:
        self._wait = (time.perf_counter(), time.thread_time())

    def end_wait(self, kind: Any, stage: int, mb: int, chain: int) -> None:
        started, cpu_started = self._wait
        ended, cpu_ended = time.perf_counter(), time.thread_time()
        self.events.append(TraceEvent(kind.value, stage, mb, chain, started, ended, cpu_ended - cpu_started))
        if self._computes:  # the compute that needed the data starts once it is in hand
            self._computes[-1][:] = (ended, cpu_ended)

    def begin_post(self, comms: tuple) -> None:
        self._post = (time.perf_counter(), time.thread_time())

    def end_post(self, comms: tuple) -> None:
        started, cpu_started = self._post
        self.events.append(TraceEvent("post", None, None, 0, started, time.perf_counter(),
                                      time.thread_time() - cpu_started, " ".join(map(str, comms))))

    def begin_finish(self) -> None:
        self._finish = (time.perf_counter(), time.thread_time())

    def end_finish(self) -> None:
        started, cpu_started = self._finish
        ended, cpu_ended = time.perf_counter(), time.thread_time()
        self.events.append(TraceEvent("finish", None, None, 0, started, ended, cpu_ended - cpu_started))
        if self._program is not None:
            began, cpu_began = self._program
            self.events.append(TraceEvent("program", None, None, 0, began, ended, cpu_ended - cpu_began))


class Trace(NamedTuple):
    """One rank's events of one ``step``/``eval``, in the order they ended."""

    rank: int
    events: tuple[TraceEvent, ...]

    @property
    def start(self) -> float:
        return min(e.start for e in self.events)

    @property
    def end(self) -> float:
        return max(e.end for e in self.events)

    def outside(self, clock: str = "wall") -> float:
        """Seconds of the step outside its program (splitting the batch, scaling the gradients; ``clock``
        ``cpu``: the calling thread's CPU time of it), 0 without ``step`` and ``program`` events."""
        step = next((e for e in self.events if e.kind == "step"), None)
        program = next((e for e in self.events if e.kind == "program"), None)
        if step is None or program is None:
            return 0.0
        return step.duration - program.duration if clock == "wall" else step.cpu - program.cpu

    def dispatch(self, clock: str = "wall") -> float:
        """Seconds per compute action the rank's program spent neither computing nor waiting (posting
        communication, handing tensors on: the runtime's own work); ``clock`` ``cpu``: by CPU time."""
        program = next((e for e in self.events if e.kind == "program"), None)
        compute = [e for e in self.events if e.kind in COMPUTE]
        if program is None or not compute:
            return 0.0
        waits = [e for e in self.events if e.kind.startswith("RECV") or e.kind == "finish"]
        if clock == "wall":
            rest = program.duration - sum(e.duration for e in compute) - sum(e.duration for e in waits)
        else:
            rest = program.cpu - sum(e.cpu for e in compute) - sum(e.cpu for e in waits)
        return max(rest, 0.0) / len(compute)

    def of_kind(self, *kinds: str) -> tuple[TraceEvent, ...]:
        return tuple(e for e in self.events if e.kind in kinds)

    def to_json(self) -> dict:
        return {"rank": self.rank, "events": [e.to_json() for e in self.events]}

    @staticmethod
    def from_json(data: dict) -> Trace:
        return Trace(data["rank"], tuple(TraceEvent(**e) for e in data["events"]))

    def breakdown(self) -> StepBreakdown:
        """Where this rank's step went (seconds)."""
        inside = [e for e in self.events if e.kind not in ("step", "program")]
        step = next((e for e in self.events if e.kind == "step"), None)
        whole = next((e for e in self.events if e.kind == "program"), None)
        first = min((e.start for e in inside), default=0.0)
        last = max((e.end for e in inside), default=0.0)
        compute = [e for e in inside if e.kind in COMPUTE]
        program = whole.duration if whole is not None else last - first
        total = step.duration if step is not None else program
        busy = sum(e.duration for e in compute)
        waits = sum(e.duration for e in inside if e.kind.startswith("RECV") or e.kind == "finish")
        posts = sum(e.duration for e in inside if e.kind == "post")
        return StepBreakdown(total, total - program, busy, waits, posts, program - busy - waits - posts,
                             len(compute))


class StepBreakdown(NamedTuple):
    """One rank's step split up (seconds): ``outside`` the program (splitting the batch, scaling gradients),
    ``compute`` (the F, B, I, W themselves), ``waits`` (for receives' data and, at the end, for sends),
    ``posts`` (handing communication to the backend) and ``between`` (the rest: the runtime's own work
    between actions); ``actions`` compute actions."""

    step: float
    outside: float
    compute: float
    waits: float
    posts: float
    between: float
    actions: int

    @property
    def per_action(self) -> float:
        """What the runtime adds per compute action beyond the compute and the waits (posts, dispatch)."""
        return (self.posts + self.between) / self.actions if self.actions else 0.0


def compute_costs(traces: Iterable[Trace], clock: str = "wall") -> dict[int, dict[str, float]]:
    """``{stage: {kind: median duration in ms}}`` of every compute action in ``traces`` (``clock``: ``wall``,
    from its start to its end; ``cpu``, its thread's CPU time): the costs the steps actually had."""
    found: dict[int, dict[str, list[float]]] = {}
    for trace in traces:
        for event in trace.events:
            if event.kind in COMPUTE and event.stage is not None:  # (a compute event has its stage)
                seconds = event.duration if clock == "wall" else event.cpu
                found.setdefault(event.stage, {}).setdefault(event.kind, []).append(seconds * 1000.0)
    return {stage: {kind: statistics.median(values) for kind, values in sorted(kinds.items())}
            for stage, kinds in sorted(found.items())}


def chrome_events(traces: Iterable[Trace], pid: int = 0, name: str = "measured") -> list[dict]:
    """One step's traces (one per rank) as Chrome/Perfetto events: process ``pid`` named ``name``, a thread
    per rank, one complete event per compute action, wait and post, in µs from the earliest rank's step start."""
    traces = list(traces)
    origin = min(t.start for t in traces)
    events: list[dict] = [{"name": "process_name", "ph": "M", "pid": pid, "tid": 0, "args": {"name": name}}]
    for trace in traces:
        events.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": trace.rank,
                       "args": {"name": f"rank {trace.rank}"}})
        for event in trace.events:
            if event.kind in ("step", "program"):
                continue
            computed = event.kind in COMPUTE  # a compute's label is a note on it, not its name
            label = f"{event.stage}{event.kind}{event.microbatch}" if computed or not event.label else event.label
            args = {"cpu_ms": event.cpu * 1000.0, **({"note": event.label} if computed and event.label else {})}
            events.append({"name": label, "cat": event.kind, "ph": "X", "pid": pid, "tid": trace.rank,
                           "ts": (event.start - origin) * 1e6, "dur": event.duration * 1e6, "args": args})
    return events
