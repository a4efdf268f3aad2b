"""``pipeforge profile``: measure a model's per-stage costs with the pipeforge runtime.

The user's model file (a ``.py``) defines::

    def pipeforge_model(stages: int) -> dict:
        return {"modules": [...],    # one torch.nn.Module per stage, stage 0 first
                "batch": x,          # stage 0's input for one step (a tensor or a tuple), split on dim 0
                "target": y,         # the last stage's target for one step, split on dim 0
                "loss_fn": fn}       # fn(output, target) -> scalar loss

It runs ZB-H1 and 1F1B in turn on local gloo processes and returns the cost file (median F, I, W, B
in ms, activation and weight-gradient bytes, link times): what each number is, ``docs/profile.md``.
"""

from __future__ import annotations

import os
import statistics
import time
from dataclasses import dataclass
from typing import Any

from pipeforge.ir import ActionKind
from pipeforge.semantics import RUNTIME_METHODS, compute_kind_names
from pipeforge.sim.costfile import cost_file_json
from pipeforge.tools.generated import load_module

MODEL_FUNCTION = "pipeforge_model"


@dataclass(frozen=True)
class ProfileJob:
    model_path: str
    module_path: str  # the generated ZB-H1 module
    fused_module_path: str | None = None  # the generated 1F1B module: times B (the fused backward) too
    steps: int = 3
    warmup: int = 1
    timeout: float = 60.0
    link_trials: int = 20
    chain_trials: int = 5  # exchanges of a stage's gradients (the whole stage: fewer than link trials)
    threads: int = 1  # torch threads per rank: one, so ranks do not fight over cores
    clock: str = "wall"  # "cpu": each action's CPU time on its thread (CLOCKS)
    pin: bool = False  # each rank on a core of its own (``pin_to_core``)


CLOCKS = {"wall": time.perf_counter, "cpu": time.thread_time}
"""How an action is timed: ``wall``, the time it took; ``cpu``, the CPU time of the thread that ran it
(a CPU device, where torch computes on the calling thread: the action's own work, without the time its
process waited for a core on a loaded machine)."""


def pin_to_core(rank: int, nproc: int) -> bool:
    """Keep rank ``rank``'s process (and the threads it starts) on one core of those it may run on, a
    core a rank, when there are at least ``nproc`` of them: a rank then never waits for a core another
    rank holds, nor loses its caches to a move. False (nothing done) where there are fewer cores, or
    where the platform or its limits allow no affinity."""
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_setaffinity") else []
    if len(cores) < nproc:
        return False
    try:
        os.sched_setaffinity(0, {cores[rank]})
    except OSError:
        return False
    return True


def claim_cores(rank: int, nproc: int, threads: int, pin: bool) -> bool:
    """The rank's torch threads, on a core of its own where ``pin`` asks; False when asked and not pinned."""
    import torch

    pinned = pin_to_core(rank, nproc) if pin else True
    torch.set_num_threads(threads)
    return pinned


class ModelFileError(Exception):
    """The model file does not follow the protocol (raised inside a rank; reported with the rank)."""


def load_model(path: str, stages: int) -> dict[str, Any]:
    """The user's model, checked against the protocol."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("pipeforge_user_model", path)
    if spec is None or spec.loader is None:  # a name Python imports no module from (not *.py)
        raise ModelFileError(f"{path}: not a Python module file (a .py file defining {MODEL_FUNCTION}(stages))")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    make = getattr(module, MODEL_FUNCTION, None)
    if not callable(make):
        raise ModelFileError(f"{path}: defines no function {MODEL_FUNCTION}(stages) (docs/profile.md)")
    model = make(stages)
    if not isinstance(model, dict):
        raise ModelFileError(f"{path}: {MODEL_FUNCTION}({stages}) returned {type(model).__name__}, not a dict")
    missing = [k for k in ("modules", "batch", "target", "loss_fn") if k not in model]
    if missing:
        raise ModelFileError(f"{path}: {MODEL_FUNCTION}({stages}) returned no {', '.join(missing)}")
    if len(model["modules"]) != stages:
        raise ModelFileError(f"{path}: {MODEL_FUNCTION}({stages}) returned {len(model['modules'])} modules, "
                             f"one per stage expected")
    return model


class _Meter:
    """Times of F, I, W of this rank's stage and the bytes F saves, I and W read."""

    def __init__(self, params, clock: str = "wall"):
        self.clock = CLOCKS[clock]
        self.params = {p.untyped_storage().data_ptr() for p in params}
        self.times: dict[str, list[float]] = {kind: [] for kind in compute_kind_names()}
        self.clock_name = clock
        self.outside: list[float] = []  # ms of each measured step outside its program (``Trace.outside``)
        self.dispatch: list[float] = []  # ms per compute action of the runtime's own work (``Trace.dispatch``)
        self.counters: dict[int, Any] = {}  # mb -> its saved tensors' bytes (the runtime's ``SavedBytes``)
        self.after_forward: dict[int, int] = {}  # mb -> bytes its F left saved
        self.after_input: dict[int, int] = {}  # mb -> bytes still saved after its I (until its W)
        self.checkpoints: list[int] = []  # bytes of each counted forward's inputs (a recompute's checkpoint)
        self.output_bytes = 0
        self.phase: tuple[str, int] | None = None
        self.recording = False  # keep the times of this step
        self.counting = False  # count the bytes of this step (its times are not kept: the hooks cost time)

    def hooks(self, mb: int, inputs):
        """Count what microbatch ``mb``'s F saves as the runtime counts it (``Pipeline.saved_peak``), given
        ``inputs`` (its arguments, target and keywords)."""
        from pipeforge.runtime.saved import SavedBytes, counted

        counter = self.counters[mb] = SavedBytes()
        return counted(counter, self.params, None, inputs)

    def wrap(self, runner, memory: bool = True) -> None:
        """Time the stage's own compute (not the waits for its inputs) by wrapping the runner's methods;
        ``memory``: also count the bytes its F saves (the split pipeline's runner)."""
        for kind in compute_kind_names():  # the runner's method of each kind has the rank context's name
            name = RUNTIME_METHODS[ActionKind(kind)]
            method = getattr(runner, name, None)
            if method is not None:
                setattr(runner, name, self._timed(kind, runner, method, memory))

    def _timed(self, kind: str, runner, method, memory: bool):
        from pipeforge.runtime.saved import hold_gradients

        def timed(mb, *args, **kwargs):
            self.phase = (kind, mb)
            started = self.clock()
            if kind == "F" and memory and self.counting:
                with self.hooks(mb, (args, kwargs)):
                    result = method(mb, *args, **kwargs)
            else:
                result = method(mb, *args, **kwargs)
            elapsed = self.clock() - started
            self.phase = None
            if kind == "F":
                self.output_bytes = _nbytes(result)
                if self.counting:  # what a recomputed forward keeps: its inputs, as the runtime counts them
                    self.checkpoints.append(_checkpoint_bytes(args, kwargs))
                    if mb in self.counters:
                        self.after_forward[mb] = self.counters[mb].held
            if kind == "I" and self.counting and mb in self.counters:  # with what its plan holds until W
                hold_gradients(self.counters[mb], runner.weight_plan(mb))
                self.after_input[mb] = self.counters[mb].held
            if self.recording:
                self.times[kind].append(elapsed * 1000.0)
            return result

        return timed

    def stage_entry(self) -> dict[str, float]:
        activation = statistics.median(self.after_forward.values()) if self.after_forward else 0
        grads = [self.after_input[mb] for mb in self.after_forward if mb in self.after_input]
        weight_grad = statistics.median(grads) if grads else 0  # may be above activation: its I adds the rest
        entry = {kind: statistics.median(self.times[kind]) for kind in compute_kind_names() if self.times[kind]}
        if "F" in entry:
            entry["R"] = entry["F"]  # R runs the forward again under autograd: the F measured here
        memory = {"activation": float(activation), "weight_grad": float(weight_grad)}
        if self.checkpoints and activation:
            memory["checkpoint"] = float(min(statistics.median(self.checkpoints), activation))
        return {**entry, **memory}

    def step_overhead(self) -> float:
        return statistics.median(self.outside) if self.outside else 0.0

    def dispatch_overhead(self) -> float:
        return statistics.median(self.dispatch) if self.dispatch else 0.0


def _checkpoint_bytes(args: tuple, kwargs: dict) -> int:
    """The bytes a recomputed forward would keep, given ``StageRunner.forward``'s arguments after the microbatch
    (``args, target, training, kwargs, ...``): the runtime's count (``saved.count_checkpoint``: each storage
    once), not a sum of its inputs' sizes."""
    from pipeforge.runtime.saved import SavedBytes, count_checkpoint

    counter = SavedBytes()
    inputs = args[0] if args else kwargs.get("args", ())
    target = args[1] if len(args) > 1 else kwargs.get("target")
    count_checkpoint(counter, inputs, args[3] if len(args) > 3 else kwargs.get("kwargs"), target)
    return counter.held


def _nbytes(value) -> int:
    import torch

    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, (tuple, list)):
        return sum(_nbytes(v) for v in value)
    if isinstance(value, dict):
        return sum(_nbytes(v) for v in value.values())
    return 0


def profile_rank(rank: int, nproc: int, job: ProfileJob) -> dict:
    """One rank's measurements: its stage's entry and the link to the next stage (ms)."""
    from pipeforge.runtime.objects import all_gather_objects

    pinned = claim_cores(rank, nproc, job.threads, job.pin)
    model = load_model(job.model_path, nproc)
    module = model["modules"][rank]
    meter = _Meter(list(module.parameters()), job.clock)
    pipes = [_profiled_pipeline(job.module_path, rank, module, model, meter, job, memory=True)]
    if job.fused_module_path is not None:  # B: the same stage under 1F1B (its F timed too)
        pipes.append(_profiled_pipeline(job.fused_module_path, rank, module, model, meter, job, memory=False))
    _measure(pipes, model, module, meter, job)
    sizes = all_gather_objects(meter.output_bytes)  # each rank's
    links = [_link_time(rank, s, sizes[s], job.link_trials) for s in range(nproc - 1)]
    shapes = all_gather_objects([(tuple(p.shape), str(p.dtype)) for p in module.parameters() if p.requires_grad])
    chain_sum = [_chain_sum_time(rank, s, nproc - 1 - s, shapes[s], job.chain_trials) for s in range(nproc)]
    return {"rank": rank, "pinned": pinned, "stage": meter.stage_entry(), "links": links,
            "step": meter.step_overhead(),
            "dispatch": meter.dispatch_overhead(), "chain_sum": chain_sum}


def _profiled_pipeline(path: str, rank: int, module, model: dict, meter: _Meter, job: ProfileJob, memory: bool):
    pipe = load_module(path).make_pipeline({rank: module}, loss_fn=model["loss_fn"], timeout=job.timeout)
    meter.wrap(pipe.runners[(rank, 0)], memory=memory)
    return pipe, memory


def _measure(pipes: list, model: dict, module, meter: _Meter, job: ProfileJob) -> None:
    """The pipelines take turns step by step, so a change in the machine's load falls on B and on I and W
    alike. A first step of the split pipeline alone counts the bytes (its hooks would slow the others'
    backward); ``warmup`` steps then ``steps`` measured ones follow."""
    batch = model["batch"] if isinstance(model["batch"], tuple) else (model["batch"],)
    meter.counting = True
    _step(pipes[0][0], model, module, batch)
    meter.counting = False
    for step in range(job.warmup + job.steps):
        meter.recording = step >= job.warmup
        for pipe, _ in pipes:
            pipe.trace = meter.recording
            _step(pipe, model, module, batch)
            if meter.recording:
                meter.outside.append(pipe.last_trace.outside(meter.clock_name) * 1000.0)
                meter.dispatch.append(pipe.last_trace.dispatch(meter.clock_name) * 1000.0)


def _step(pipe, model: dict, module, batch: tuple) -> None:
    pipe.step(*(batch if pipe.holds_first else ()), target=model["target"] if pipe.holds_last else None,
              return_outputs=False)
    for param in module.parameters():
        param.grad = None


def _link_time(rank: int, link: int, nbytes: int, trials: int) -> float | None:
    """Half the median round trip of ``nbytes`` between ranks ``link`` and ``link + 1`` (ms; None elsewhere)."""
    import torch
    import torch.distributed as dist

    dist.barrier()
    if rank not in (link, link + 1):
        return None
    buffer = torch.empty(max(nbytes, 1), dtype=torch.uint8)
    peer = link + 1 if rank == link else link
    trips = []
    for _ in range(trials + 1):
        started = time.perf_counter()
        if rank == link:
            dist.send(buffer, peer)
            dist.recv(buffer, peer)
        else:
            dist.recv(buffer, peer)
            dist.send(buffer, peer)
        trips.append((time.perf_counter() - started) * 1000.0 / 2)
    return statistics.median(trips[1:])


def _chain_sum_time(rank: int, first: int, second: int, shapes: list[tuple], trials: int) -> float | None:
    """What a bidirectional schedule does once a step for one stage whose replicas are on ranks ``first``
    and ``second`` (``Pipeline._reduce_chains``): flatten its gradients, exchange them, add the other's
    in; the median over ``trials`` (ms, wall), on those two ranks (None elsewhere). One rank holding
    both replicas adds them in place."""
    import torch
    import torch.distributed as dist

    from pipeforge.runtime.gradients import add_flat, flat_grads

    dist.barrier()
    if rank not in (first, second):
        return None
    params = [torch.nn.Parameter(torch.zeros(shape, dtype=getattr(torch, dtype.removeprefix("torch."))))
              for shape, dtype in shapes]  # the stage's parameters' shapes (the stage's module is on one rank)
    times = []
    for _ in range(trials + 1):
        for param in params:
            param.grad = torch.ones_like(param)
        started = time.perf_counter()
        if first == second:
            for param in params:
                grad = param.grad
                assert grad is not None, "set above"
                param.grad = grad + grad
        else:
            flat = flat_grads(params)
            incoming = torch.empty_like(flat)
            peer = second if rank == first else first
            works = [dist.isend(flat, peer), dist.irecv(incoming, peer)]
            for work in works:
                assert work is not None, "the default group holds every rank"
                work.wait()
            add_flat(params, incoming)
        times.append((time.perf_counter() - started) * 1000.0)
    return statistics.median(times[1:])


def profile_job(rank: int, nproc: int, job: ProfileJob) -> dict:
    """The worker ``spawn`` runs (``pipeforge.tools.profiling:profile_job``)."""
    return profile_rank(rank, nproc, job)


def cost_file(reports: list[dict]) -> dict:
    """The cost file (``pipeforge.sim.costfile`` schema) from every rank's report."""
    ordered = sorted(reports, key=lambda r: r["rank"])
    stages = [{k: round(v, 6) for k, v in r["stage"].items()} for r in ordered]
    links = [round(ordered[s]["links"][s], 6) for s in range(len(ordered) - 1)]
    step = round(max(r["step"] for r in ordered), 6)
    chain_sum = [round(max(r["chain_sum"][s] for r in ordered if r["chain_sum"][s] is not None), 6)
                 for s in range(len(ordered))]
    dispatch = round(statistics.median(r["dispatch"] for r in ordered), 6)
    return cost_file_json(stages, links, units="ms", step=step, chain_sum=chain_sum, dispatch=dispatch)
