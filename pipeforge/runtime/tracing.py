"""The rank context a traced pipeline runs (``pipeline.trace = True``; ``pipeforge.runtime.trace``)."""

from __future__ import annotations

import time

from pipeforge.ir import Action
from pipeforge.runtime.custom import HookedRankContext
from pipeforge.runtime.trace import TraceEvent


class TracingRankContext(HookedRankContext):
    """The pipeline's rank context, recording a ``TraceEvent`` per compute, wait, post and the final wait."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.trace_events: list[TraceEvent] = []
        self._began: tuple[float, float] | None = None  # the running compute's start (wall, cpu)
        self._program_began: tuple[float, float] | None = None

    def _compute(self, kind: str, stage: int, mb: int, chain: int) -> None:
        outer = self._began
        self._began = (time.perf_counter(), time.thread_time())
        super()._compute(kind, stage, mb, chain)
        started, cpu_started = self._began
        self._began = outer
        self.trace_events.append(TraceEvent(kind, stage, mb, chain, started, time.perf_counter(),
                                            time.thread_time() - cpu_started))

    def _take(self, kind, stage: int, chain: int, mb: int) -> tuple:
        if Action(stage, kind, mb, chain) in self._handed:  # from a stage on this rank: no wait
            return super()._take(kind, stage, chain, mb)
        started, cpu_started = time.perf_counter(), time.thread_time()
        tensors = super()._take(kind, stage, chain, mb)
        ended = time.perf_counter()
        self.trace_events.append(TraceEvent(kind.value, stage, mb, chain, started, ended,
                                            time.thread_time() - cpu_started))
        if self._began is not None:  # the compute that needed the data starts once it is in hand
            self._began = (ended, time.thread_time())
        return tensors

    def post(self, *comms) -> None:
        started, cpu_started = time.perf_counter(), time.thread_time()
        super().post(*comms)
        label = " ".join(map(str, comms))
        self.trace_events.append(TraceEvent("post", None, None, 0, started, time.perf_counter(),
                                            time.thread_time() - cpu_started, label))

    def begin_program(self) -> None:
        """The rank's program starts now (its end is ``finish``'s): the ``program`` event."""
        self._program_began = (time.perf_counter(), time.thread_time())

    def finish(self) -> None:
        started, cpu_started = time.perf_counter(), time.thread_time()
        super().finish()
        ended, cpu_ended = time.perf_counter(), time.thread_time()
        self.trace_events.append(TraceEvent("finish", None, None, 0, started, ended, cpu_ended - cpu_started))
        began = self._program_began
        if began is not None:
            self.trace_events.append(TraceEvent("program", None, None, 0, began[0], ended, cpu_ended - began[1]))
