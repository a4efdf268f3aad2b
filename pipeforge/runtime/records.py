"""Records of where a rank was when its step failed or hung (``make_pipeline(records=DIR)``).

``Recorder``, one of the rank context's observers, keeps in O(1) per action the last action started and
finished, the communication posted and not complete, and what the rank waits for; it writes
``DIR/rank-<r>.json`` atomically when the step raises, once the step has run past its timeout, and when
it ends well. The record (``FORMAT``): schedule name and ``fingerprint``, the generated module (path,
SHA-256), rank, host, pid, step index, state (``failed``, ``running``, ``finished``), the error,
``last_started``, ``last_finished``, ``waiting_for``, ``posted_unfinished``, ``phase``.
``pipeforge diagnose DIR`` reads them (``tools/diagnose.py``; ``docs/torch.md``).
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import sys
import threading
import time
from pathlib import Path

from pipeforge.ir import Action, ActionKind
from pipeforge.semantics import RECEIVES

FORMAT = "pipeforge-record/1"
ENVIRONMENT = "PIPEFORGE_RECORDS"


def fingerprint(info) -> str:
    """What identifies a schedule across ranks: its name, shape and placements."""
    facts = json.dumps([info.name, info.ranks, info.stages, info.microbatches, [list(p) for p in info.placements]])
    return hashlib.sha256(facts.encode()).hexdigest()[:16]


def module_of(program) -> tuple[str | None, str | None]:
    """The file of the generated module a rank function comes from, and the SHA-256 of its text."""
    module = sys.modules.get(getattr(program, "__module__", ""))
    path = getattr(module, "__file__", None)
    if path is None:
        return None, None
    try:
        digest = hashlib.sha256(Path(path).read_bytes()).hexdigest()
    except OSError:
        return os.path.abspath(path), None
    return os.path.abspath(path), digest


def resolve_directory(records) -> Path | None:
    """``records=`` or, when not given, ``PIPEFORGE_RECORDS``; None when neither names a directory."""
    chosen = records if records is not None else os.environ.get(ENVIRONMENT) or None
    return None if chosen is None else Path(chosen)


class Recorder:
    """A ``context.Observer`` (duck-typed: this module imports no torch) keeping one rank's place."""

    def __init__(self, directory: Path, info, rank: int, program, timeout: float | None):
        self.directory = Path(directory)
        self.info = info
        self.rank = rank
        self.module, self.module_sha256 = module_of(program)
        self.timeout = timeout
        self.step_index = -1
        self._closed = False
        self._lock = threading.Lock()
        self._timer: threading.Timer | None = None
        self._reset()

    @property
    def path(self) -> Path:
        return self.directory / f"rank-{self.rank}.json"

    def _reset(self) -> None:
        # kept as the observer's arguments and made text only when a record is written: O(1), no formatting
        self.last_started: tuple | None = None
        self.last_finished: tuple | None = None
        self.waiting_for: tuple | None = None
        self.posted: dict = {}  # posted and not complete, in posting order (communication actions)
        self.phase = "program"

    # -- the step's life ---------------------------------------------------------

    def begin_step(self) -> None:
        self.step_index += 1
        self._closed = False
        self._reset()
        if self.timeout:
            # later than the waits' own timeout, so a wait that times out writes first
            self._timer = threading.Timer(1.5 * self.timeout, self._overdue)
            self._timer.daemon = True
            self._timer.start()

    def end_step(self) -> None:
        """The step ended (well or not): the watchdog goes; no thread outlives the call."""
        timer, self._timer = self._timer, None
        if timer is not None:
            timer.cancel()

    def failed(self, error: BaseException) -> Path | None:
        self.end_step()
        self._closed = True  # a watchdog already firing must not overwrite this record
        return self.write("failed", f"{type(error).__name__}: {error}")

    def finished(self) -> Path | None:
        """The step ended well: a peer that hangs later in it finds this rank's record saying so."""
        return self.write("finished", "")

    def _overdue(self) -> None:
        if not self._closed:
            self.write("running", f"the step has run longer than the timeout ({self.timeout:g} s)")

    # -- Observer ----------------------------------------------------------------

    def begin_program(self) -> None: ...

    def begin_compute(self, kind: str, stage: int, mb: int, chain: int) -> None:
        self.last_started = (kind, stage, mb, chain)

    def end_compute(self, kind: str, stage: int, mb: int, chain: int) -> None:
        self.last_finished = (kind, stage, mb, chain)

    def begin_wait(self, kind, stage: int, mb: int, chain: int) -> None:
        self.waiting_for = (kind, stage, mb, chain)

    def end_wait(self, kind, stage: int, mb: int, chain: int) -> None:
        self.posted.pop(Action(stage, ActionKind(kind), mb, chain), None)
        self.waiting_for = None

    def begin_post(self, comms) -> None:
        self.last_started = comms
        for comm in comms:
            self.posted[comm] = None

    def end_post(self, comms) -> None:
        self.last_finished = comms

    def begin_finish(self) -> None:
        self.phase = "finish"

    def end_finish(self) -> None:
        self.posted = {comm: None for comm in self.posted if comm.kind in RECEIVES}
        self.phase = "done"

    # -- writing -----------------------------------------------------------------

    def record(self, state: str, error: str) -> dict:
        return {
            "format": FORMAT, "schedule": self.info.name, "fingerprint": fingerprint(self.info),
            "ranks": self.info.ranks, "rank": self.rank, "module": self.module, "module_sha256": self.module_sha256,
            "host": socket.gethostname(), "pid": os.getpid(), "time": time.time(), "step_index": self.step_index,
            "state": state, "error": error, "phase": self.phase, "last_started": text(self.last_started),
            "last_finished": text(self.last_finished), "waiting_for": text(self.waiting_for),
            "posted_unfinished": [str(comm) for comm in list(self.posted)],
        }

    def write(self, state: str, error: str) -> Path | None:
        """Write the record atomically; a directory that cannot be written costs the record, not the error."""
        with self._lock:
            try:
                self.directory.mkdir(parents=True, exist_ok=True)
                temporary = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
                temporary.write_text(json.dumps(self.record(state, error), indent=1) + "\n", encoding="utf-8")
                os.replace(temporary, self.path)
            except OSError:
                return None
        return self.path


def text(event) -> str | None:
    """A compute or wait (kind, stage, microbatch, chain) or a posted group (its actions) as torch's text."""
    if event is None:
        return None
    if isinstance(event[0], (str, ActionKind)):
        kind, stage, mb, chain = event
        return str(Action(stage, ActionKind(kind), mb, chain))
    return str(event[0]) if len(event) == 1 else "[" + " ".join(map(str, event)) + "]"
