"""``Pipeline``: what a generated module's ``make_pipeline`` returns.

``step(*args, target=None, losses=None, return_outputs=True, shared_kwargs=None, stage_kwargs=None,
**kwargs)`` runs this rank's program with torch's ``schedule.step`` semantics: the batch on the rank(s)
holding stage 0, split into microbatches as torch splits it (``microbatch.py``); ``target`` on the
rank(s) holding the last stage, where ``losses`` is filled and the merged outputs come back; gradients
accumulated into ``.grad`` (divided by the microbatch count when ``scale_grads``, once per parameter),
a bidirectional schedule's replicas summed, and nothing of the step's autograd graph alive afterwards.
``eval`` runs the forwards only; ``check`` the preflight (``preflight.py``); ``parameters()`` every
distinct parameter, for the optimizer. The whole contract: ``docs/runtime.md``.
"""

from __future__ import annotations

import copy
import sys
import time
from collections.abc import Callable, Mapping, MutableSequence
from datetime import timedelta
from functools import cached_property
from typing import Any

import torch
import torch.distributed as dist

from pipeforge.ir import Action
from pipeforge.runtime import preflight
from pipeforge.runtime.arguments import (
    check_callable,
    check_flag,
    check_group,
    checked_device,
    checked_records,
    checked_timeout,
)
from pipeforge.runtime.context import Observer, RankContext, ScheduleInfo, ShapeCache
from pipeforge.runtime.custom import CustomFunction, kind_name
from pipeforge.runtime.custom import custom_functions as checked_functions
from pipeforge.runtime.fingerprint import agree, record
from pipeforge.runtime.fsdp import DataParallel, data_parallel, is_sharded
from pipeforge.runtime.gradients import (
    TiedParameters,
    add_flat,
    add_local,
    check_same_start,
    distinct_parameters,
    divide,
    flat_grads,
    local,
    trained,
)
from pipeforge.runtime.memory import ActivationCount
from pipeforge.runtime.microbatch import merge_chunks, split_inputs, split_value, to_device
from pipeforge.runtime.optimizer_watch import watch as watch_optimizers
from pipeforge.runtime.p2p import PipelineError, PipelineUsageError, Transfer, Transport
from pipeforge.runtime.records import Recorder
from pipeforge.runtime.recovery import StepStart, connect
from pipeforge.runtime.rng import StepRng
from pipeforge.runtime.rows import BatchRows, named_tensors
from pipeforge.runtime.saved import SavedActivations, unkept_inputs
from pipeforge.runtime.stage import StageRunner
from pipeforge.runtime.step_trace import Trace, TraceEvent, Tracer
from pipeforge.semantics import RECEIVES

RankProgram = Callable[[RankContext], None]


class Pipeline:
    """One rank's side of a generated schedule: its program, its stage replicas and its transport."""

    def __init__(self, info: ScheduleInfo, program: RankProgram, runners: dict[tuple[int, int], StageRunner],
                 transport: Transport, *, scale_grads: bool = True, tied: TiedParameters = TiedParameters(),
                 data_parallel: DataParallel | None = None, functions: dict[str, CustomFunction] | None = None):
        self.info = info
        self.rank = transport.rank
        self._program = program
        self.runners = runners
        self.transport = transport
        self.scale_grads = scale_grads
        self.tied = tied
        self._caches = ShapeCache()
        # every step's recompute and offload state (``RankContext.saved``), begun afresh by each
        self._saved = SavedActivations(frozenset(info.recomputed), frozenset(info.offloaded), transport.device)
        self._start = StepStart(info, self.rank)  # what a step begins with, and a failed step leaves
        self._rows = BatchRows(info, self.rank)  # the batch's rows, that targets and inputs must split like
        self._input_shapes: tuple | None = None
        self._passed: set[tuple] = set()  # the keys of calls every check of ``_prepare`` passed (``_call_key``)
        self.data_parallel = data_parallel or DataParallel(self.rank, {})
        self.functions = dict(functions or {})
        self.activations: ActivationCount | None = None  # the last step's count (``pipeforge.runtime.memory``)
        self.count_saved = False  # set True: count the bytes of saved activations (``runtime/saved.py``)
        self.saved_peak: int | None = None  # the last step's peak bytes of saved activations on this rank
        self.trace = False  # True: record every later step's action timings (``pipeforge.runtime.step_trace``)
        self.last_trace: Trace | None = None  # the last traced step's ``Trace``
        self.observers: list[Observer] = []  # told of every later step's actions (``context.Observer``)
        self._tracer: Tracer | None = None
        self.recorder: Recorder | None = None  # records where this rank was when a step fails (``records``)
        self.post_early = True  # post receives ahead of the program where the rules allow (``RankContext.post_early``)
        self._receives = _receives_of(program)  # the program's receives, in the order it posts them
        self.preflight = True  # the first step()/eval() runs check() with its arguments first (``_preflight``)
        self._checked: set[bool] = set()  # the modes (training or not) check() passed for
        self.rng_seed: int | None = None  # each forward's RNG seeded per (step, stage, microbatch) (``rng.py``)
        self.rng_step = 0  # the step index the next step() seeds with (every call of step() adds one)

    @property
    def end_agreement(self) -> bool:
        """Every call ends agreeing with every rank whether it failed anywhere (``recovery.StepStart.end``);
        set False on every rank to leave it out."""
        return self._start.agreeing

    @end_agreement.setter
    def end_agreement(self, value: bool) -> None:
        self._start.agreeing = bool(value)

    def register_custom_function(self, kind: Any, function: CustomFunction) -> None:
        """Run ``function(action, ctx)`` instead of the runtime's own for every action of ``kind`` (see
        ``pipeforge.runtime.custom``); torch's ``_PipelineScheduleRuntime.register_custom_function``."""
        self.functions.update(checked_functions({kind_name(kind): function}))

    @property
    def stages(self) -> list[int]:
        """The stages this rank runs (in either chain)."""
        return list(self._stages)

    @cached_property
    def _stages(self) -> tuple[int, ...]:
        return tuple(sorted({stage for stage, _ in self.runners}))

    @cached_property
    def holds_first(self) -> bool:
        return any(stage == 0 for stage, _ in self.runners)

    @cached_property
    def holds_last(self) -> bool:
        return any(r.is_last for r in self.runners.values())

    def step(self, *args: Any, target: Any = None, losses: list | None = None, return_outputs: bool = True,
             shared_kwargs: Mapping[str, Any] | None = None,
             stage_kwargs: Mapping[int, Mapping[str, Any]] | None = None, **kwargs: Any) -> Any:
        """One training step over all microbatches; outputs merged on the last stage's rank."""
        self.rng_step += 1  # every call, refused or failed: every rank counts its calls alike
        return self._guarded(self._step, args, kwargs, target, losses, return_outputs, shared_kwargs, stage_kwargs)

    def _guarded(self, call, *arguments) -> Any:
        """``call`` (a step or an eval), after the first call's ``check`` (``preflight``); if it fails once its
        communication began (``StepStart.begin``), nothing of it is left to meet the next one, and every rank
        learns that it failed (``StepStart.end``: ``pipeforge.runtime.recovery``)."""
        self._start.begun = False
        self.transport.begin_step()  # every call its own tag, refused or not: every rank counts its calls alike
        shapes = self._input_shapes
        try:
            self._preflight(call == self._step, *arguments)
            result = self._traced(call, *arguments) if self.trace else call(*arguments)
        except BaseException as error:
            self._input_shapes = shapes  # a batch refused or failed does not become the shape later ones keep
            self._passed.clear()  # (what the checks passed for stood on the shapes kept)
            if not self._start.begun:  # refused by the check, on every rank together: nothing left behind
                raise
            told = self._start.failed(self.transport, error)  # the peers learn of it (recovery.StepStart.failed)
            if isinstance(error, Exception) and self.end_agreement:
                self._start.end(self.transport, failed=True)  # the ranks that finished learn of it too
            if told is None:
                raise
            for note in getattr(error, "__notes__", ()):
                _add_note(told, note)
            raise told from error
        if self.end_agreement:
            self._start.end(self.transport, failed=False)  # raises where another rank's step failed
        return result

    def _preflight(self, training: bool, args, kwargs, target, losses, outputs, shared, per_stage) -> None:
        """The first ``step()`` (and the first ``eval()``) runs ``check`` with its arguments first, unless
        ``preflight`` is off or ``check`` passed already; it raises on every rank together."""
        if not self.preflight or training in self._checked:
            return
        # data-parallel or FSDP stages (on any rank): the inputs alone, every rank alike
        ran = preflight.check(self, args, kwargs, target, shared, per_stage, training=training,
                              run_stages=not self.data_parallel.hooks_compute)
        self._checked.update((training, False) if ran else (training,))

    def _step(self, args, kwargs, target, losses, return_outputs, shared_kwargs, stage_kwargs) -> Any:
        if len(self.info.placements) < 2:  # one chain: no replica to sync, no gradients to set aside or sum
            ctx = self._run(args, kwargs, target, shared_kwargs, stage_kwargs, losses, training=True,
                            rng_step=self.rng_step - 1)
        else:
            self._sync_replicas()
            earlier = self._set_aside_chain_grads()
            try:
                ctx = self._run(args, kwargs, target, shared_kwargs, stage_kwargs, losses, training=True,
                                rng_step=self.rng_step - 1)
                self._reduce_chains()
            finally:
                _add_back(earlier)
        if self.tied.groups:
            self.tied.sum_gradients(self.transport, self.stage_modules(), self.info)
        if self.scale_grads:
            self._scale(self.info.microbatches)
        return self._results(ctx, losses, return_outputs)

    def check(self, *args: Any, target: Any = None, shared_kwargs: Mapping[str, Any] | None = None,
              stage_kwargs: Mapping[int, Mapping[str, Any]] | None = None, **kwargs: Any) -> None:
        """Before the first step, on every rank, with ``step()``'s arguments: microbatch 0 through every stage,
        stage by stage; a non-tensor output, a failing module or loss, reentrant checkpointing under a split
        backward raise the same ``PipelineUsageError`` on every rank (``pipeforge.runtime.preflight``)."""
        preflight.check(self, args, kwargs, target, shared_kwargs, stage_kwargs)
        self._checked.update((True, False))

    def refusal(self, target: Any, training: bool) -> str | None:
        """What is wrong with the target a step or an eval is given on this rank (``None``: nothing)."""
        last = self.info.stages - 1
        if not self.holds_last:
            if target is not None:
                return (f"rank {self.rank} runs stages {self.stages}, not the last stage {last}: target= goes to "
                        "the rank holding the last stage")
            return None
        if training and any([r.loss_fn is None for r in self._last_runners]):
            return (f"rank {self.rank} holds the last stage {last}: step() trains and needs "
                    "make_pipeline(loss_fn=...); use eval() for a forward pass only")
        if training and target is None:
            return (f"rank {self.rank} holds the last stage {last}: step() needs target= (split per microbatch "
                    "and given to loss_fn with the stage's output)")
        return None

    def eval(self, *args: Any, target: Any = None, losses: list | None = None, return_outputs: bool = True,
             shared_kwargs: Mapping[str, Any] | None = None,
             stage_kwargs: Mapping[int, Mapping[str, Any]] | None = None, **kwargs: Any) -> Any:
        """Forward only, without gradients; losses filled when ``target`` and ``loss_fn`` are given."""
        return self._guarded(self._eval, args, kwargs, target, losses, return_outputs, shared_kwargs, stage_kwargs)

    def _eval(self, args, kwargs, target, losses, return_outputs, shared_kwargs, stage_kwargs) -> Any:
        self._sync_replicas()
        ctx = self._run(args, kwargs, target, shared_kwargs, stage_kwargs, losses, training=False,
                        rng_step=self.rng_step)
        return self._results(ctx, losses, return_outputs)

    def _traced(self, call, *arguments) -> Any:
        """``call`` with its actions traced into ``last_trace`` (``pipeforge.runtime.step_trace``)."""
        tracer = self._tracer = Tracer()
        started, cpu_started = time.perf_counter(), time.thread_time()
        try:
            result = call(*arguments)
        finally:
            self._tracer = None
        events = tracer.events
        events.append(TraceEvent("step", None, None, 0, started, time.perf_counter(), time.thread_time() - cpu_started))
        self.last_trace = Trace(self.rank, tuple(events))
        return result

    # -- inputs ----------------------------------------------------------------------

    def _run(self, args: tuple, kwargs: dict, target: Any, shared: Any, per_stage: Any, losses: Any, training: bool,
             rng_step: int) -> RankContext:
        rng = StepRng(self.rng_seed, rng_step, self.transport.device) if self.rng_seed is not None else None
        saved = self._saved
        saved.begin()
        ctx = RankContext(self.info, self.rank, self.runners, self.transport, self._caches, training=training,
                          functions=self.functions, data_parallel=self.data_parallel,
                          observers=self._observers() if self._tracer or self.recorder or self.observers else (),
                          rng=rng, saved=saved)
        if self.count_saved:
            ctx.saved.start_counting()
        refusal = None
        try:
            if losses is not None and not isinstance(losses, MutableSequence):
                raise PipelineUsageError(_losses_refused(self.rank, losses))
            named = self._prepare(ctx, args, kwargs, target, shared, per_stage, training)
        except Exception as error:  # noqa: BLE001 (whatever refuses the arguments refuses the step on every rank)
            refusal, named = error, []
        # the step's communication starts (recovery.StepStart): a rank refusing its arguments tells every rank
        self._caches = ctx.caches = self._start.begin(self.transport, self._caches, refusal)
        self._rows.agree(self.transport, named, self._start)  # the first call: every rank's rows split like the batch
        self.data_parallel.begin(training)
        for runner in self.runners.values():
            runner.reset()
        recorder = self.recorder
        if recorder is None:
            self._run_program(ctx, training)
        else:
            self._recorded(recorder, ctx, training)
        self.data_parallel.end()  # waits for every gradient reduction REDUCE_GRAD started
        self.activations = ctx.activations
        self.saved_peak = ctx.saved.counter.peak if ctx.saved.counter is not None else None
        ctx.saved.finish()
        return ctx

    def _prepare(self, ctx: RankContext, args: tuple, kwargs: dict, target: Any, shared: Any, per_stage: Any,
                 training: bool) -> list[tuple[str, int, bool]]:
        """The call's arguments checked and split into ``ctx`` (a ``PipelineUsageError`` says what is wrong);
        the tensors split into microbatches, with their rows (``rows.named_tensors``).

        What the checks read of a call of plain tensors on the device (``_call_key``: the mode, each tensor's
        shape and dtype, whether a target came) is all they read of it once the batch's shapes were set and
        the rows agreed: a call whose key passed them then passes them again, so it is split at once, as
        they split it; any other call goes through them (``_passed``, forgotten when a call fails)."""
        key = None
        if not kwargs and shared is None and per_stage is None:
            key = _call_key(args, target, training, self.transport.device)
        if key is not None and key in self._passed:
            chunks = self.info.microbatches
            ctx.inputs = split_inputs(args, {}, chunks) if args else []
            ctx.targets = split_value(target, chunks) if target is not None else []
            return []
        problem = self.refusal(target, training)
        if problem:
            raise PipelineUsageError(problem)
        if shared is not None or per_stage is not None:
            ctx.stage_inputs = self._stage_inputs(shared, per_stage)
        ctx.inputs = self._batch(args, kwargs, ctx.stage_inputs.get(0))
        if self.holds_last and target is not None:
            device = self.transport.device
            if type(target) is not torch.Tensor or target.device != device:
                target = to_device(target, device)
            ctx.targets = split_value(target, self.info.microbatches, f"rank {self.rank}: target")
        named = named_tensors(args, kwargs, target, shared, per_stage, self._stages)
        problem = self._rows.problem_known(named)
        if not problem and training and self.info.recomputed:  # a recomputed stage 0 needs a tensor input to keep
            problem = unkept_inputs(self.info, self.rank, ctx.inputs, ctx.stage_inputs.get(0))  # (runtime/saved.py)
        if problem:
            raise PipelineUsageError(problem)
        if key is not None and self._rows.rows is not None:  # the rows were agreed: every check above ran
            self._passed.add(key)
        return named

    def _run_program(self, ctx: RankContext, training: bool) -> None:
        ctx.begin_program()
        if self.post_early and self._receives:
            ctx.post_early(self._receives)
        enabled = torch.is_grad_enabled()  # the step's mode (set_grad_enabled's own switch, without its calls)
        torch._C._set_grad_enabled(training)
        try:
            self._program(ctx)
        finally:
            torch._C._set_grad_enabled(enabled)
        ctx.finish()

    def _recorded(self, recorder: Recorder, ctx: RankContext, training: bool) -> None:
        """``_run_program`` leaving a record of this rank's place when it raises (``pipeforge.runtime.records``)."""
        recorder.begin_step()
        try:
            self._run_program(ctx, training)
        except BaseException as error:
            path = recorder.failed(error)
            where = f"rank {self.rank}'s record: {path}" if path else f"rank {self.rank}: no record could be written"
            _add_note(error, f"pipeforge: {where} (pipeforge diagnose {recorder.directory})")
            if isinstance(error, PipelineError) and error.args and isinstance(error.args[0], str):
                error.args = (f"{error.args[0]} [{where}]", *error.args[1:])
            raise
        finally:
            recorder.end_step()
        recorder.finished()

    def _observers(self) -> tuple[Observer, ...]:
        """The rank context's observers for this call: the tracer when tracing, the recorder, then ``observers``."""
        tracer = (self._tracer,) if self._tracer is not None else ()
        recorder = (self.recorder,) if self.recorder is not None else ()
        return (*tracer, *recorder, *self.observers)

    def _batch(self, args: tuple, kwargs: dict, stage0_inputs: list[dict] | None) -> list[tuple[tuple, dict]]:
        """The batch as microbatches for stage 0 (keyword inputs included)."""
        where = f"rank {self.rank}: step()/eval()"
        if not self.holds_first:
            if args or kwargs:
                raise PipelineUsageError(
                    f"rank {self.rank} runs stages {self.stages}, not stage 0: the batch goes to the rank holding "
                    f"stage 0 (rank {self.info.rank_of(0)}); give inputs every stage needs as shared_kwargs=, "
                    "one stage's as stage_kwargs=")
            return []
        if not args and not kwargs:
            raise PipelineUsageError(f"rank {self.rank} holds stage 0: pass the batch to step()/eval()")
        clash = sorted(set(kwargs) & set(stage0_inputs[0])) if kwargs and stage0_inputs else ()
        if clash:
            raise PipelineUsageError(f"{where}: keyword(s) {clash} given both as the batch and as per-stage inputs "
                                     "of stage 0")
        device = self.transport.device
        if not kwargs and all([type(a) is torch.Tensor for a in args]):  # plain tensors: _metas's answer at once
            if device.type != "cpu" or not all([a.is_cpu for a in args]):
                args = tuple([a if a.device == device else a.to(device) for a in args])
            shapes = tuple([(a.shape, a.dtype) for a in args])
        else:
            args, kwargs = to_device(args, device), to_device(kwargs, device)
            shapes = _metas((args, kwargs))  # the whole batch's: one shape gives one shape per microbatch
        if self._input_shapes is not None and shapes != self._input_shapes:
            raise PipelineUsageError(f"rank {self.rank}: the batch changed shape since the first step; "
                                     "build a new pipeline for another batch shape")
        chunks = split_inputs(args, kwargs, self.info.microbatches, where)
        self._input_shapes = shapes
        return chunks

    def _stage_inputs(self, shared: Any, per_stage: Any) -> dict[int, list[dict]]:
        """For every stage this rank holds, its keyword inputs per microbatch (shared and its own)."""
        if shared is None and per_stage is None:
            return {}
        shared = _keywords(shared, f"rank {self.rank}: shared_kwargs")
        per_stage = self._per_stage(per_stage)
        inputs = {}
        for stage in self._stages:
            own = per_stage.get(stage, {})
            clash = sorted(set(shared) & set(own))
            if clash:
                raise PipelineUsageError(f"rank {self.rank}: keyword(s) {clash} of stage {stage} given both in "
                                         "shared_kwargs and in stage_kwargs")
            merged = {**shared, **own}
            if merged:
                where = f"rank {self.rank}: inputs of stage {stage}"
                chunks = split_inputs((), to_device(merged, self.transport.device), self.info.microbatches, where)
                inputs[stage] = [kw for _, kw in chunks]
        return inputs

    def _per_stage(self, per_stage: Any) -> dict[int, dict]:
        if per_stage is None:
            return {}
        where = f"rank {self.rank}: stage_kwargs"
        if not isinstance(per_stage, Mapping):
            raise PipelineUsageError(f"{where} must map a stage to a dict of keyword inputs, e.g. "
                                     f"{{1: {{'mask': mask}}}}; got {type(per_stage).__name__}")
        for stage in per_stage:
            if not isinstance(stage, int) or not 0 <= stage < self.info.stages:
                raise PipelineUsageError(f"{where}: {stage!r} is not a stage of schedule {self.info.name!r} "
                                         f"(stages 0..{self.info.stages - 1})")
        return {stage: _keywords(value, f"{where}[{stage}]") for stage, value in per_stage.items()}

    # -- results ---------------------------------------------------------------------

    def _results(self, ctx: RankContext, losses: list | None, return_outputs: bool) -> Any:
        last = self._last_runners
        if not last:
            return None
        if len(last) == 1:  # one last stage on this rank (every schedule but a bidirectional one's)
            found, outputs = last[0].losses, last[0].outputs
        else:
            found = {mb: loss for r in last for mb, loss in r.losses.items()}
            outputs = {mb: out for r in last for mb, out in r.outputs.items()}
        if losses is not None:
            losses.clear()
            losses.extend(loss.detach() if loss is not None else None
                          for loss in (found.get(mb) for mb in range(self.info.microbatches)))
        chunks = [outputs[mb] for mb in sorted(outputs)] if return_outputs else None
        for runner in last:
            runner.outputs = {}
            runner.losses = {}
        if chunks is None:  # (not return_outputs)
            return None
        enabled = torch.is_grad_enabled()  # the outputs as the stages made them, merged without their graphs
        torch._C._set_grad_enabled(False)
        try:
            return merge_chunks(chunks)
        finally:
            torch._C._set_grad_enabled(enabled)

    @cached_property
    def _last_runners(self) -> list[StageRunner]:
        return [r for r in self.runners.values() if r.is_last]

    # -- gradients -------------------------------------------------------------------

    def modules(self) -> list[torch.nn.Module]:
        """Every distinct module this rank runs (replicas included)."""
        seen: dict[int, torch.nn.Module] = {}
        for runner in self.runners.values():
            seen.setdefault(id(runner.module), runner.module)
        return list(seen.values())

    def stage_modules(self) -> dict[int, torch.nn.Module]:
        """The module of every stage this rank runs, as given to ``make_pipeline`` (not chain-1 copies)."""
        return {stage: runner.module for (stage, _), runner in sorted(self.runners.items(), reverse=True)}

    def parameters(self) -> list[torch.nn.Parameter]:
        """Every distinct parameter of this rank's modules: one shared by several stages counts once.
        The optimizer's input: ``torch.optim.AdamW(pipe.parameters())``."""
        return distinct_parameters(self.modules())

    def _scale(self, divisor: int) -> None:
        """Divide every gradient by ``divisor`` (``gradients.divide``); an FSDP gradient (a DTensor) in its local
        shard, which is the same elementwise division without DTensor's dispatch (several times its cost)."""
        grads = []
        for param in self.parameters():
            grad = param.grad
            if grad is not None:
                grads.append(grad if type(grad) is torch.Tensor else local(grad))
        if not grads:
            return
        enabled = torch.is_grad_enabled()  # no_grad's own switch, without its context manager's calls
        torch._C._set_grad_enabled(False)
        try:
            divide(grads, divisor)
        finally:
            torch._C._set_grad_enabled(enabled)

    def _sync_replicas(self) -> None:
        """Same-rank chain-1 replicas start every step with the chain-0 module's parameters."""
        for (stage, chain), runner in self.runners.items():
            original = self.runners.get((stage, 0))
            if chain == 1 and original is not None:
                with torch.no_grad():
                    for mine, theirs in zip(runner.module.parameters(), original.module.parameters()):
                        mine.copy_(theirs)

    def _set_aside_chain_grads(self) -> list[tuple[torch.nn.Parameter, torch.Tensor]]:
        """Bidirectional schedules: the gradients held before the step, set aside so that the chains sum
        this step's gradients alone (``_add_back`` returns them to the modules given to make_pipeline).

        A chain-1 copy on the rank of its chain-0 module starts every step without gradients: what it held
        was the last step's sum, which counted once already."""
        if len(self.info.placements) < 2:
            return []
        given = {id(p) for m in self.stage_modules().values() for p in m.parameters()}
        earlier = []
        for param in self.parameters():
            if param.grad is not None and id(param) in given:
                earlier.append((param, param.grad))
            param.grad = None
        return earlier

    def _reduce_chains(self) -> None:
        """Sum the two replicas' gradients of every stage; both replicas end with the sum."""
        if len(self.info.placements) < 2:
            return
        transfers, arriving = [], []
        for stage, chain in sorted(self.runners):
            other = self.info.rank_of(stage, 1 - chain)
            mine = self.runners[(stage, chain)].module
            if other == self.rank:
                if chain == 0:
                    add_local(mine, self.runners[(stage, 1)].module)
                continue
            flat = flat_grads(trained(mine))
            if flat.numel() == 0:
                continue
            incoming = torch.empty_like(flat)
            transfers += [Transfer(True, flat, other), Transfer(False, incoming, other)]
            arriving.append((mine, incoming))
        self.transport.exchange(transfers, "the gradient sum across chains")
        for module, incoming in arriving:
            add_flat(trained(module), incoming)

    def check_replicas_equal(self) -> None:
        """Each stage of a bidirectional schedule starts equal in both chains (replicas on two ranks)."""
        if len(self.info.placements) < 2:
            return
        for stage, chain in sorted(self.runners):
            other = self.info.rank_of(stage, 1 - chain)
            if other == self.rank:
                continue
            params = [p.detach().reshape(-1) for p in self.runners[(stage, chain)].module.parameters()]
            flat = torch.cat(params) if params else torch.zeros(0)
            check_same_start(self.transport, flat, [other], f"stage {stage} (its replica in chain {chain})",
                             f"a bidirectional schedule runs stage {stage} in chain 0 on rank "
                             f"{self.info.rank_of(stage, 0)} and in chain 1 on rank {self.info.rank_of(stage, 1)}: "
                             "build both replicas from one seed, or copy one into the other")


def _receives_of(program: RankProgram) -> tuple[Action, ...]:
    """The receives ``program`` posts, in order (recorded as ``make_pipeline``'s agreement records it)."""
    try:
        actions = record(program).actions
    except Exception:  # noqa: BLE001 (a program that does not run is refused by the agreement, before any step)
        return ()
    return tuple(a for a in actions if a.kind in RECEIVES)


def _add_back(earlier: list[tuple[torch.nn.Parameter, torch.Tensor]]) -> None:
    """The gradients ``Pipeline._set_aside_chain_grads`` set aside, added to this step's."""
    for param, grad in earlier:
        param.grad = grad if param.grad is None else grad + param.grad


def _add_note(error: BaseException, note: str) -> None:
    """``error.add_note(note)``; on Python 3.10, which has no ``add_note``, the note kept where 3.11 keeps it."""
    if sys.version_info >= (3, 11):
        error.add_note(note)
    else:
        vars(error).setdefault("__notes__", []).append(note)


def _keywords(value: Any, where: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping) or not all(isinstance(k, str) for k in value):
        raise PipelineUsageError(f"{where} must be a dict of keyword inputs (name -> value); got "
                                 f"{type(value).__name__}")
    return dict(value)


def _call_key(args: tuple, target: Any, training: bool, device: torch.device) -> tuple | None:
    """What ``Pipeline._prepare``'s checks read of a call of plain tensors on ``device`` and nothing else, once
    the batch's shapes are set and its rows agreed: the mode, each argument's and the target's shape and dtype,
    whether a target came (``None``: another call, which they read whole)."""
    on_cpu = device.type == "cpu"
    for value in (*args, target) if target is not None else args:
        if type(value) is not torch.Tensor or not (value.is_cpu if on_cpu else value.device == device):
            return None
    meta = tuple([(a.shape, a.dtype) for a in args])
    return training, meta, None if target is None else (target.shape, target.dtype)


def _metas(chunk: Any) -> tuple:
    """The (shape, dtype) of every tensor in ``chunk``, in a fixed order (what one step's batch must keep)."""
    if isinstance(chunk, torch.Tensor):
        return ((chunk.shape, chunk.dtype),)
    if isinstance(chunk, Mapping):
        return tuple(m for key in sorted(chunk, key=str) for m in _metas(chunk[key]))
    if isinstance(chunk, (tuple, list)):
        return tuple(m for item in chunk for m in _metas(item))
    return ()


def build_pipeline(info: ScheduleInfo, programs: dict[int, RankProgram], stage_modules: dict[int, torch.nn.Module],
                   *, loss_fn=None, rank=None, group=None, device=None, scale_grads=True,
                   timeout: float | None = None, tied_parameters=None, dp_group=None, fsdp: bool = False,
                   custom_functions: dict | None = None, records=None, rng_seed: int | None = None) -> Pipeline:
    """Wire a generated module's rank programs to this process's stage modules; ``records`` (or
    ``PIPEFORGE_RECORDS``): the directory where a failed or overdue step leaves this rank's record;
    ``rng_seed``: seed each forward's RNG per (step, stage, microbatch) (``pipeforge.runtime.rng``)."""
    if not dist.is_initialized():
        raise PipelineError("torch.distributed is not initialized: call init_process_group first")
    check_group(group, "group")
    size = dist.get_world_size(group)
    if size != info.ranks:
        raise PipelineUsageError(f"schedule {info.name!r} runs on {info.ranks} ranks, the process group has {size}")
    rank = dist.get_rank(group) if rank is None else rank
    if not isinstance(rank, int) or not 0 <= rank < info.ranks:
        raise PipelineUsageError(f"rank {rank!r} is out of range: schedule {info.name!r} runs on ranks "
                                 f"0..{info.ranks - 1}")
    check_group(dp_group, "dp_group")
    timeout = checked_timeout(timeout, rank)
    check_callable(loss_fn, "loss_fn", rank)
    check_flag(scale_grads, "scale_grads", rank)
    check_flag(fsdp, "fsdp", rank)
    directory = checked_records(records, rank)
    tied = TiedParameters.parse(tied_parameters, info.stages, rank)
    device = checked_device(device, rank) if device is not None else _default_device(group)
    functions = checked_functions(custom_functions)
    if rng_seed is not None and (not isinstance(rng_seed, int) or isinstance(rng_seed, bool)):
        raise PipelineUsageError(f"rank {rank}: rng_seed must be an integer (or None), got {rng_seed!r}")
    runners = _runners(info, rank, stage_modules, loss_fn)
    replicas = _data_parallel(info, rank, stage_modules, dp_group, fsdp, device)
    wait = timedelta(seconds=timeout) if timeout is not None else None
    if _has_nccl(group) and device.type == "cuda":
        # every rank joins one collective first, so NCCL creates the group's communicator together
        # (a batch_isend_irecv that only some ranks enter first is undefined behaviour in NCCL)
        dist.all_reduce(torch.zeros(1, device=device), group=group)
    transport = Transport(group, rank, wait, device)
    alive = connect(transport, info, group)  # its own gloo group: a failed step never reaches the caller's
    agree(info, programs, rank, transport)  # every rank runs one schedule's unedited module, or all refuse
    pipeline = Pipeline(info, programs[rank], runners, transport, scale_grads=scale_grads, tied=tied,
                        data_parallel=replicas, functions=functions)
    pipeline.rng_seed = rng_seed
    pipeline._start.alive = alive  # a rank at a meeting after a failure learns at once that one is gone
    watch_optimizers(pipeline)  # a parameter an optimizer lists twice is warned about at its first step
    if directory is not None:
        pipeline.recorder = Recorder(directory, info, rank, programs[rank], timeout)
    pipeline.check_replicas_equal()
    tied.check_equal(transport, {stage: stage_modules[stage] for stage in pipeline.stages}, info)
    return pipeline


def _data_parallel(info: ScheduleInfo, rank: int, stage_modules: dict, dp_group, fsdp: bool, device) -> DataParallel:
    replicated = fsdp or dp_group is not None or any(map(is_sharded, stage_modules.values()))
    if replicated and len(info.placements) > 1:
        raise PipelineUsageError(f"rank {rank}: data-parallel or FSDP stages with the bidirectional schedule "
                                 f"{info.name!r} are not supported (its two replicas of a stage sum their gradients)")
    return data_parallel(rank, stage_modules, dp_group=dp_group, fsdp=fsdp, device=device)


def _losses_refused(rank: int, losses: Any) -> str:
    return (f"rank {rank}: step()/eval() losses= must be a list (cleared, then filled with each microbatch's "
            f"loss), got {type(losses).__name__}")


def _has_nccl(group) -> bool:
    """NCCL alone, or NCCL for CUDA in a mixed group (``cpu:gloo,cuda:nccl``, torch's default)."""
    return "nccl" in str(dist.get_backend(group))


def _default_device(group) -> torch.device:
    """The device follows the backend: the current CUDA device under NCCL, else the CPU."""
    if _has_nccl(group) and torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _runners(info: ScheduleInfo, rank: int, stage_modules: Any, loss_fn) -> dict:
    held = info.held(rank)
    wanted = sorted({stage for stage, _ in held})
    _check_stage_modules(info, rank, stage_modules, wanted)
    runners = {}
    for stage, chain in held:
        module = stage_modules[stage]
        if chain == 1 and (stage, 0) in held:
            module = copy.deepcopy(module)
        last = stage == info.stages - 1
        runners[(stage, chain)] = StageRunner(module, stage, chain, stage == 0, last, loss_fn if last else None,
                                              rank=rank)
    return runners


def _check_stage_modules(info: ScheduleInfo, rank: int, stage_modules: Any, wanted: list[int]) -> None:
    example = "{" + ", ".join(f"{s}: module_{s}" for s in wanted) + "}"
    if not isinstance(stage_modules, Mapping):
        raise PipelineUsageError(f"rank {rank}: stage_modules must be a dict from each stage this rank runs to its "
                                 f"module, here {example}; got {type(stage_modules).__name__}")
    if not all(isinstance(s, int) for s in stage_modules) or sorted(stage_modules) != wanted:
        raise PipelineUsageError(f"rank {rank} runs stages {wanted} of schedule {info.name!r}; "
                                 f"stage_modules has {sorted(stage_modules, key=repr)}")
    for stage, module in stage_modules.items():
        if not isinstance(module, torch.nn.Module):
            raise PipelineUsageError(f"rank {rank}: stage_modules[{stage}] must be a torch.nn.Module; got "
                                     f"{type(module).__name__}")
    if len(info.placements) > 1:
        _refuse_shared_parameters(rank, stage_modules)


def _refuse_shared_parameters(rank: int, stage_modules: Mapping[int, torch.nn.Module]) -> None:
    """Two chains sum each stage's gradients across replicas: a parameter two stages share would count twice."""
    owner: dict[int, tuple[int, str]] = {}
    for stage in sorted(stage_modules):
        for name, param in stage_modules[stage].named_parameters():
            first = owner.setdefault(id(param), (stage, name))
            if first[0] != stage:
                raise PipelineUsageError(
                    f"rank {rank}: stage {first[0]} ({first[1]!r}) and stage {stage} ({name!r}) share one parameter; "
                    "a bidirectional schedule sums each stage's gradients across its two chains, so stages must not "
                    "share parameters: give each stage its own copy and name them in "
                    "make_pipeline(tied_parameters=...) (pipeforge.split(..., untie=True) does both)")
