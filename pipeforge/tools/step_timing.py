"""Step times of several generated schedules run with one model file (``benchmarks/profile/loop.py``)."""

from __future__ import annotations

import copy
import statistics
import time
from dataclasses import dataclass

from pipeforge.tools.generated import load_module
from pipeforge.tools.profiling import claim_cores, load_model


@dataclass(frozen=True)
class TimingJob:
    """Step times of several generated modules (one per schedule) with one model file."""

    model_path: str
    module_paths: tuple[str, ...]
    steps: int = 5
    warmup: int = 2
    timeout: float = 120.0
    threads: int = 1
    trace: bool = False  # also return every measured step's trace (``pipeforge.runtime.step_trace``)
    pin: bool = False  # each rank on a core of its own (``pin_to_core``)
    # per module, a layer map: the model file's whole model (``pipeforge_layers()``) cut by ``pipeforge.split``
    # with these layers per stage, instead of its ``pipeforge_model(stages)`` stage modules (None: those)
    layers: tuple[tuple[int, ...] | None, ...] = ()


def time_schedules(rank: int, nproc: int, job: TimingJob) -> dict:
    """The step times (ms, the slowest rank's) of each generated module, every measured step (``steps_ms``)
    and their median (``ms``), and the median CPU time of a step summed over the ranks (``cpu_ms``: with
    the step time, how many cores the step kept busy); with ``job.trace``, every measured step's trace of
    this rank (``traces``).

    The schedules take turns step by step (after a barrier each), the first of a round moving on by one
    each round, so a change in the machine's load falls on all of them alike and none always follows
    the same one.
    """
    import torch
    import torch.distributed as dist

    pinned = claim_cores(rank, nproc, job.threads, job.pin)
    layouts = job.layers or (None,) * len(job.module_paths)
    runs = [_timed_pipeline(rank, path, job, layers) for path, layers in zip(job.module_paths, layouts)]
    samples: list[list[tuple[float, float]]] = [[] for _ in runs]
    traces: list[list[dict]] = [[] for _ in runs]
    for step in range(job.warmup + job.steps):
        for turn in range(len(runs)):
            index = (turn + step) % len(runs)
            pipe, modules, model, batch = runs[index]
            dist.barrier()
            started, cpu_started = time.perf_counter(), time.process_time()
            pipe.step(*(batch if pipe.holds_first else ()), target=model["target"] if pipe.holds_last else None,
                      return_outputs=False)
            elapsed = torch.tensor([(time.perf_counter() - started) * 1000.0])
            cpu = torch.tensor([(time.process_time() - cpu_started) * 1000.0])
            dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
            dist.all_reduce(cpu, op=dist.ReduceOp.SUM)
            for module in modules:
                for param in module.parameters():
                    param.grad = None
            if step >= job.warmup:
                samples[index].append((elapsed.item(), cpu.item()))
                if job.trace:
                    traces[index].append(pipe.last_trace.to_json())
    return {"rank": rank, "pinned": pinned, "ms": [statistics.median(w for w, _ in s) for s in samples],
            "cpu_ms": [statistics.median(c for _, c in s) for s in samples],
            "steps_ms": [[w for w, _ in s] for s in samples],
            **({"traces": traces} if job.trace else {})}


def _timed_pipeline(rank: int, path: str, job: TimingJob, layers: tuple[int, ...] | None = None):
    generated = load_module(path)
    held = sorted({stage for stage, _ in generated.SCHEDULE.held(rank)})
    if layers is not None:
        return _split_pipeline(rank, generated, held, job, layers)
    model = load_model(job.model_path, generated.SCHEDULE.stages)
    mine = {stage: copy.deepcopy(model["modules"][stage]) for stage in held}
    pipe = generated.make_pipeline(mine, loss_fn=model["loss_fn"], timeout=job.timeout)
    pipe.trace = job.trace
    batch = model["batch"] if isinstance(model["batch"], tuple) else (model["batch"],)
    return pipe, list(mine.values()), model, batch


def _split_pipeline(rank: int, generated, held: list[int], job: TimingJob, layers: tuple[int, ...]):
    """The model file's whole model (``pipeforge_layers()``, with its optional ``target`` and ``loss_fn``;
    else the output's mean is the loss) cut into this rank's stages with ``layers`` per stage."""
    import torch

    from pipeforge.models.profile import load_layer_model
    from pipeforge.models.split import split

    found = load_layer_model(job.model_path)
    cut = split(found["model"], generated.SCHEDULE, owned=held, layers=list(layers))
    target = found.get("target")
    if target is None:
        target = torch.zeros(found["batch"].size(0))
    loss_fn = found.get("loss_fn") or _mean_loss
    pipe = generated.make_pipeline(cut.modules, loss_fn=loss_fn, tied_parameters=cut.tied_parameters,
                                   timeout=job.timeout)
    pipe.trace = job.trace
    return pipe, list(cut.modules.values()), {"target": target}, (found["batch"],)


def _mean_loss(output, target):
    return output.float().mean()
