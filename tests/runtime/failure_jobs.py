"""The job of the per-step failure tests: one rank fails at one point of a step, or dies (spawned gloo processes)."""

from __future__ import annotations

import os
import signal
import time
from datetime import timedelta

import torch


class Faulty(torch.nn.Module):
    """``inner``, raising ``ValueError("a bad batch")`` at its ``when``-th forward while ``armed`` (``kills``:
    killing its process there instead, SIGKILL)."""

    def __init__(self, inner: torch.nn.Module, when: int, kills: bool = False):
        super().__init__()
        self.inner, self.when, self.armed, self.calls, self.kills = inner, when, False, 0, kills

    def forward(self, x):
        self.calls += 1
        if self.armed and self.calls == self.when:
            if self.kills:
                os.kill(os.getpid(), signal.SIGKILL)
            raise ValueError("a bad batch")
        return self.inner(x)


def faulty_steps(rank: int, nproc: int, job: dict) -> list[tuple[str, float]]:
    """Four steps of the demo MLP; at the second, rank ``job["victim"]`` fails as ``job["fault"]`` says:
    ``first`` its stage raises at its first forward (before it sends anything), ``mid`` at its third, ``late``
    it sleeps ``job["late"]`` seconds first, ``optimizer`` its optimizer raises after the step (the process
    ends with the error), ``dead`` it sleeps ``job["late"]`` seconds and is killed (SIGKILL), ``killed`` it is
    killed at its stage's second forward, mid-step, ``reconnect`` its stage raises at its first forward and it
    is killed at the next step's meeting, once every rank came and before gloo connects them. What each step
    raised on this rank ('' where it returned) and the seconds it took."""
    from pipeforge.runtime import PipelineError
    from pipeforge.tools import demo_models as models
    from pipeforge.tools.generated import load_module

    generated = load_module(job["path"])
    info = generated.SCHEDULE
    full = models.build_stages("mlp", info.stages, seed=0)
    victim, fault = rank == job["victim"], job["fault"]
    when = {"first": 1, "mid": 3, "killed": 2, "reconnect": 1}.get(fault, 0)
    mine = {s: Faulty(full[s], when, fault == "killed") if victim else full[s] for s in info.stages_of(rank)}
    # the first step, which no fault touches, waits as long as a healthy step may under a load spike; the
    # later ones within job["wait"], which the late rank outlasts
    pipe = generated.make_pipeline(mine, loss_fn=models.loss_fn, timeout=job["warm"])
    pipe.preflight = False  # the failure is inside step(): no check's forward before it (it counts forwards)
    if victim and fault == "reconnect":  # the meeting's rendezvous ran, every rank came: dies before gloo's
        pipe.transport.reconnect = lambda *args, **kwargs: os.kill(os.getpid(), signal.SIGKILL)  # type: ignore
    optimizer = torch.optim.SGD(pipe.parameters(), lr=0.0)
    x, y = models.make_batch(info.stages, 8, seed=0)
    seen = []
    for index in range(4):
        if index == 1:
            pipe.transport.timeout = timedelta(seconds=job["wait"])
        for module in mine.values():
            module.armed, module.calls = victim and index == 1, 0
        if victim and index == 1 and fault in ("late", "dead"):
            time.sleep(job["late"])
            if fault == "dead":
                os.kill(os.getpid(), signal.SIGKILL)
        started = time.monotonic()
        try:
            pipe.step(*((x,) if pipe.holds_first else ()), target=y if pipe.holds_last else None)
            seen.append(("", time.monotonic() - started))
        except PipelineError as error:
            seen.append((str(error), time.monotonic() - started))
        if victim and index == 1 and fault == "optimizer":
            raise ValueError("the optimizer failed")
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return seen


def failing_often(rank: int, nproc: int, job: dict) -> list[tuple[bool, int, int]]:
    """``job["steps"]`` steps of the demo MLP, every other one failing (stage 0 raises at its first forward):
    after each, whether it failed, this process's threads and the keys on the default store."""
    import torch.distributed as dist

    from pipeforge.tools import demo_models as models
    from tests.demo_jobs import demo_pipeline, timed_step

    pipe = demo_pipeline(job, rank, lambda stage, module: Faulty(module, 1) if stage == 0 else module)
    pipe.preflight = False  # the failure is inside step(): no check's forward before it (it counts forwards)
    first = pipe.stage_modules().get(0)
    x, y = models.make_batch(pipe.info.stages, 8, seed=0)
    store = dist.distributed_c10d._get_default_store()
    seen = []
    for index in range(job["steps"]):
        if first is not None:
            first.armed, first.calls = index % 2 == 1, 0
        error, _ = timed_step(pipe, x, y)
        seen.append((bool(error), len(os.listdir("/proc/self/task")), store.num_keys()))
    return seen
