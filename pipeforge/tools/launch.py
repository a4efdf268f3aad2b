"""Run a function on N local processes joined in one gloo group on 127.0.0.1.

``spawn(worker, nproc, payload, timeout=...)`` starts the processes (the
``forkserver`` start method: one server imports torch once, every rank is a
fresh fork of it, so a run costs one torch import, not N), initializes ``torch.distributed`` in each with a TCP
store on a free port of 127.0.0.1 and the given timeout, calls
``worker(rank, nproc, payload)``, and returns every rank's ``Outcome``. A rank
that does not report within the deadline is killed (only the processes started
here, by their handles) and reported as timed out: nothing hangs.
``time_scale()``: how many times slower than idle this machine runs now, by which
the launcher's deadlines and the defaults of the commands' waits are multiplied.
"""

from __future__ import annotations

import importlib
import multiprocessing
import os
import queue
import socket
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from pipeforge.errors import UsageError

LOCALHOST = "127.0.0.1"
TIME_SCALE_VARIABLE = "PIPEFORGE_TIME_SCALE"
# torch.autograd imports symbolic_shapes (sympy) on the first backward with explicit gradients
PRELOAD = ["torch", "torch.distributed", "torch.fx.experimental.symbolic_shapes", "pipeforge.tools.reference_check"]


@dataclass(frozen=True)
class Outcome:
    rank: int
    ok: bool
    value: Any = None
    error: str = ""


def time_scale() -> float:
    """``PIPEFORGE_TIME_SCALE`` where set (a number, at least 1), else the load average of the last minute
    per core, at least 1: on a machine loaded tenfold, waits that a healthy peer meets alone in
    one second may take ten. A ``UsageError`` names a variable that is not such a number."""
    given = os.environ.get(TIME_SCALE_VARIABLE, "").strip()
    if given:
        try:
            value = float(given)
        except ValueError:
            value = float("nan")
        if not 1 <= value < float("inf"):
            raise UsageError(f"{TIME_SCALE_VARIABLE}={given!r}: expected a number of at least 1")
        return value
    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):  # not on this platform
        return 1.0
    return max(1.0, load / (os.cpu_count() or 1))  # the machine's cores: its load average counts them all


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((LOCALHOST, 0))
        return sock.getsockname()[1]


def resolve_backend(requested: str, nproc: int) -> str:
    """``auto``: NCCL when there is a GPU for every rank, else gloo (torch is imported only if a GPU may exist)."""
    if requested != "auto":
        return requested
    if not any(os.path.exists(f"/dev/nvidia{i}") for i in range(64)):
        return "gloo"
    import torch

    return "nccl" if torch.cuda.is_available() and torch.cuda.device_count() >= nproc else "gloo"


def init_group(rank: int, nproc: int, port: int, backend: str, timeout: float) -> None:
    import torch.distributed as dist

    dist.init_process_group(backend, init_method=f"tcp://{LOCALHOST}:{port}", rank=rank, world_size=nproc,
                            timeout=timedelta(seconds=timeout))


def resolve(worker: str | Callable) -> Callable:
    """A worker named ``"package.module:function"`` (so the parent need not import it) or the function."""
    if callable(worker):
        return worker
    module, _, name = worker.partition(":")
    return getattr(importlib.import_module(module), name)


def _child(rank: int, nproc: int, port: int, backend: str, timeout: float, worker: str | Callable, payload: Any,
           results) -> None:
    import torch

    torch.set_num_threads(1)
    try:
        worker = resolve(worker)
        if backend == "nccl":
            torch.cuda.set_device(rank % torch.cuda.device_count())
        init_group(rank, nproc, port, backend, timeout)
        value = worker(rank, nproc, payload)
        results.put(Outcome(rank, True, value))
    except BaseException as error:  # noqa: BLE001 (reported to the parent, which decides)
        results.put(Outcome(rank, False, error=_describe(error)))
        results.close()
        results.join_thread()
        os._exit(1)  # peers may be gone: skip destroy_process_group, which could wait for them
    _shutdown()


def _shutdown() -> None:
    import torch.distributed as dist

    try:
        dist.barrier()
        dist.destroy_process_group()
    except Exception:  # noqa: BLE001 (a peer already gone: nothing left to tidy)
        pass


def _describe(error: BaseException) -> str:
    from pipeforge.runtime.p2p import PipelineError

    if isinstance(error, PipelineError):
        return f"PipelineError: {error}"
    return "".join(traceback.format_exception(error)).strip()


def spawn(worker: str | Callable[[int, int, Any], Any], nproc: int, payload: Any = None, *, timeout: float = 60.0,
          backend: str = "gloo", deadline: float | None = None) -> list[Outcome]:
    """Run ``worker(rank, nproc, payload)`` on ``nproc`` local ranks; ``deadline`` bounds the run: the seconds
    it may take on an idle machine (default ``2 * timeout + 30``), allowed ``time_scale()`` times that here.
    ``timeout`` (each rank's wait to join the group) is used as given.

    Name the worker ``"module:function"`` to keep torch out of the parent process. A free port
    taken by someone else between choosing and binding it gets one retry on another port.
    """
    outcomes = _spawn_once(worker, nproc, payload, timeout, backend, deadline)
    if any("address already in use" in o.error.lower() for o in outcomes):
        outcomes = _spawn_once(worker, nproc, payload, timeout, backend, deadline)
    return outcomes


def _spawn_once(worker, nproc: int, payload: Any, timeout: float, backend: str,
                deadline: float | None) -> list[Outcome]:
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(PRELOAD)
    results = context.Queue()
    port = free_port()
    processes = [
        context.Process(target=_child, args=(rank, nproc, port, backend, timeout, worker, payload, results),
                        daemon=True)
        for rank in range(nproc)
    ]
    for process in processes:
        process.start()
    allowed = (deadline if deadline is not None else timeout * 2 + 30) * time_scale()
    outcomes = _collect(results, processes, time.monotonic() + allowed)
    grace = time.monotonic() + 3  # ranks that reported are tidying up; the rest are killed
    for process in processes:
        process.join(timeout=max(0.0, grace - time.monotonic()))
        if process.is_alive():
            process.kill()
            process.join()
    return [outcomes.get(r, Outcome(r, False, error="did not report before the deadline")) for r in range(nproc)]


RUN_TIMEOUT = 30.0  # seconds a rank of `pipeforge run` waits for a peer on an idle machine (times time_scale())


def _collect(results, processes: list, deadline: float) -> dict[int, Outcome]:
    outcomes: dict[int, Outcome] = {}
    while len(outcomes) < len(processes) and time.monotonic() < deadline:
        try:
            outcome = results.get(timeout=0.2)
            outcomes[outcome.rank] = outcome
        except queue.Empty:
            if all(not p.is_alive() for p in processes) and results.empty():
                break
    for rank, process in enumerate(processes):
        if rank not in outcomes and process.exitcode not in (None, 0):
            outcomes[rank] = Outcome(rank, False, error=f"process exited with code {process.exitcode}")
    return outcomes


def run_check(module_path: str, nproc: int, *, steps: int = 2, model: str = "mlp", backend: str = "gloo",
              timeout: float | None = None, device: str | None = None) -> dict:
    """``pipeforge run``'s check on ``nproc`` local processes: the verdict, with each failed rank's error.
    ``timeout``: how long a rank waits for a peer (default ``RUN_TIMEOUT`` times ``time_scale()``)."""
    base = RUN_TIMEOUT if timeout is None else timeout  # the deadline is in idle seconds: spawn scales it
    timeout = RUN_TIMEOUT * time_scale() if timeout is None else timeout
    job = {"module_path": module_path, "model": model, "steps": steps, "timeout": timeout, "device": device}
    outcomes = spawn("pipeforge.tools.reference_check:check_job_fields", nproc, job, timeout=timeout, backend=backend,
                     deadline=base * (steps + 2) + 30)
    failed = [o for o in outcomes if not o.ok]
    if failed:
        # null, not infinity: the JSON stays strict when nothing could be compared
        return {"match": False, "max_abs_diff": None, "errors": {o.rank: o.error for o in failed}}
    return summarize([o.value for o in outcomes])


def summarize(reports: list[dict]) -> dict:
    """One verdict from every rank's report."""
    return {
        "match": all(r["match"] for r in reports),
        "max_abs_diff": max((r["max_abs_diff"] for r in reports), default=0.0),
        "max_rel_diff": max((r["max_rel_diff"] for r in reports), default=0.0),
        "worst": max(reports, key=lambda r: r["max_abs_diff"])["worst"] if reports else "",
        "missing": [m for r in reports for m in r["missing"]][:5],
    }
