"""``Pipeline``: what a generated module's ``make_pipeline`` returns.

``step`` has torch's ``schedule.step`` semantics: the rank(s) holding stage 0
pass the whole batch, which is split into microbatches on dim 0; the rank(s)
holding the last stage pass ``target`` (split likewise) and get ``losses``
filled and the merged outputs back; gradients accumulate into ``.grad`` and are
divided by the number of microbatches when ``scale_grads``.

Bidirectional schedules (two chains, as Chimera): ``stage_modules`` is keyed by
stage and holds every stage this rank runs in either chain. When a rank runs the
same stage in both chains, the chain-1 replica is a deep copy of the module,
refreshed from it at the start of every step. After the program, the two
replicas' gradients of every stage are summed (a send/receive pair between the
two ranks, or an addition on one rank), so both end with the same gradients.
With two chains, ``losses`` holds one entry per microbatch, ``None`` for those
whose last stage ran on the other chain's rank, and outputs merge the
microbatches this rank finished.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from pipeforge.runtime.context import RankContext, ScheduleInfo, ShapeCache
from pipeforge.runtime.custom import CustomFunction, HookedRankContext, kind_name
from pipeforge.runtime.custom import custom_functions as checked_functions
from pipeforge.runtime.fsdp import DataParallel, data_parallel, is_sharded
from pipeforge.runtime.memory import ActivationCount
from pipeforge.runtime.microbatch import merge_chunks, split_args, split_value
from pipeforge.runtime.p2p import PipelineError, TensorMeta, Transfer, Transport
from pipeforge.runtime.stage import StageRunner

RankProgram = Callable[[RankContext], None]


class Pipeline:
    """One rank's side of a generated schedule: its program, its stage replicas and its transport."""

    def __init__(self, info: ScheduleInfo, program: RankProgram, runners: dict[tuple[int, int], StageRunner],
                 transport: Transport, *, scale_grads: bool = True, data_parallel: DataParallel | None = None,
                 functions: dict[str, CustomFunction] | None = None):
        self.info = info
        self.rank = transport.rank
        self._program = program
        self.runners = runners
        self.transport = transport
        self.scale_grads = scale_grads
        self._caches = ShapeCache()
        self._input_shapes: tuple | None = None
        self.data_parallel = data_parallel or DataParallel(self.rank, {})
        self.functions = dict(functions or {})

    def register_custom_function(self, kind: Any, function: CustomFunction) -> None:
        """Run ``function(action, ctx)`` instead of the runtime's own for every action of ``kind`` (see
        ``pipeforge.runtime.custom``); torch's ``_PipelineScheduleRuntime.register_custom_function``."""
        self.functions.update(checked_functions({kind_name(kind): function}))
        self.activations: ActivationCount | None = None  # the last step's count (``pipeforge.runtime.memory``)

    @property
    def holds_first(self) -> bool:
        return any(stage == 0 for stage, _ in self.runners)

    @property
    def holds_last(self) -> bool:
        return any(r.is_last for r in self.runners.values())

    def step(self, *inputs: Any, target: Any = None, losses: list | None = None, return_outputs: bool = True) -> Any:
        """One training step over all microbatches; outputs merged on the last stage's rank."""
        if self.holds_last and any(r.loss_fn is None for r in self.runners.values() if r.is_last):
            raise PipelineError("step() trains and needs loss_fn on the rank holding the last stage; "
                                "use eval() for a forward pass only")
        self._sync_replicas()
        ctx = self._run(inputs, target, training=True)
        self._reduce_chains()
        if self.scale_grads:
            self._scale(self.info.microbatches)
        return self._results(ctx, losses, return_outputs)

    def eval(self, *inputs: Any, target: Any = None, losses: list | None = None) -> Any:
        """Forward only, without gradients; losses filled when ``target`` and ``loss_fn`` are given."""
        self._sync_replicas()
        ctx = self._run(inputs, target, training=False)
        return self._results(ctx, losses, True)

    def _run(self, inputs: tuple, target: Any, training: bool) -> RankContext:
        ctx = HookedRankContext(self.info, self.rank, self.runners, self.transport, self._caches,
                                functions=self.functions, data_parallel=self.data_parallel)
        ctx.training = training
        self.data_parallel.begin(training)
        for runner in self.runners.values():
            runner.reset()
        if self.holds_first:
            ctx.inputs = self._split_inputs(inputs)
        if self.holds_last and target is not None:
            ctx.targets = split_value(_to_device(target, self.transport.device), self.info.microbatches)
        with torch.set_grad_enabled(training):
            self._program(ctx)
        ctx.finish()
        self.data_parallel.end()  # waits for every gradient reduction REDUCE_GRAD started
        self.activations = ctx.activations
        return ctx

    def _split_inputs(self, inputs: tuple) -> list[tuple]:
        if not inputs:
            raise PipelineError(f"rank {self.rank} holds stage 0: pass the batch to step()/eval()")
        inputs = tuple(_to_device(t, self.transport.device) for t in inputs)
        chunks = split_args(inputs, self.info.microbatches)
        shapes = tuple(tuple(TensorMeta.of(t) for t in chunk if isinstance(t, torch.Tensor)) for chunk in chunks)
        if self._input_shapes is not None and shapes != self._input_shapes:
            raise PipelineError(f"rank {self.rank}: the batch changed shape since the first step; "
                                "build a new pipeline for another batch shape")
        self._input_shapes = shapes
        return chunks

    def _results(self, ctx: RankContext, losses: list | None, return_outputs: bool) -> Any:
        last = [r for r in self.runners.values() if r.is_last]
        if not last:
            return None
        if losses is not None:
            found = {mb: loss for r in last for mb, loss in r.losses.items()}
            losses.extend(found.get(mb) for mb in range(self.info.microbatches))
        if not return_outputs:
            return None
        outputs = {mb: out for r in last for mb, out in r.outputs.items()}
        return merge_chunks([outputs[mb] for mb in sorted(outputs)])

    # -- gradients -------------------------------------------------------------------

    def modules(self) -> list[torch.nn.Module]:
        """Every distinct module this rank runs (replicas included)."""
        seen: dict[int, torch.nn.Module] = {}
        for runner in self.runners.values():
            seen.setdefault(id(runner.module), runner.module)
        return list(seen.values())

    def parameters(self) -> list[torch.nn.Parameter]:
        """Every distinct parameter of this rank's modules: one shared by several stages counts once."""
        seen: dict[int, torch.nn.Parameter] = {}
        for module in self.modules():
            for param in module.parameters():
                seen.setdefault(id(param), param)
        return list(seen.values())

    def _scale(self, divisor: int) -> None:
        for param in self.parameters():
            if param.grad is not None:
                param.grad.div_(divisor)

    def _sync_replicas(self) -> None:
        """Same-rank chain-1 replicas start every step with the chain-0 module's parameters."""
        for (stage, chain), runner in self.runners.items():
            original = self.runners.get((stage, 0))
            if chain == 1 and original is not None:
                with torch.no_grad():
                    for mine, theirs in zip(runner.module.parameters(), original.module.parameters()):
                        mine.copy_(theirs)

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
                    _add_local(mine, self.runners[(stage, 1)].module)
                continue
            flat = _flat_grads(mine)
            if flat.numel() == 0:
                continue
            incoming = torch.empty_like(flat)
            transfers += [Transfer(True, flat, other), Transfer(False, incoming, other)]
            arriving.append((mine, incoming))
        self.transport.exchange(transfers, "the gradient sum across chains")
        for module, incoming in arriving:
            _add_flat(module, incoming)


def _to_device(value: Any, device: torch.device) -> Any:
    if isinstance(value, torch.Tensor):
        return value.to(device)
    if isinstance(value, (tuple, list)):
        return type(value)(_to_device(v, device) for v in value)
    return value


def _params(module: torch.nn.Module) -> list[torch.nn.Parameter]:
    return [p for p in module.parameters() if p.requires_grad]


def _flat_grads(module: torch.nn.Module) -> torch.Tensor:
    params = _params(module)
    if not params:
        return torch.zeros(0)
    return torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in params])


def _add_flat(module: torch.nn.Module, incoming: torch.Tensor) -> None:
    offset = 0
    for param in _params(module):
        part = incoming[offset: offset + param.numel()].view_as(param)
        offset += param.numel()
        param.grad = part.clone() if param.grad is None else param.grad + part


def _add_local(original: torch.nn.Module, replica: torch.nn.Module) -> None:
    for mine, theirs in zip(_params(original), _params(replica)):
        if theirs.grad is None:
            continue
        mine.grad = theirs.grad.clone() if mine.grad is None else mine.grad + theirs.grad
    for mine, theirs in zip(_params(original), _params(replica)):
        theirs.grad = None if mine.grad is None else mine.grad.clone()


def build_pipeline(info: ScheduleInfo, programs: dict[int, RankProgram], stage_modules: dict[int, torch.nn.Module],
                   *, loss_fn=None, rank=None, group=None, device=None, scale_grads=True,
                   timeout: float | None = None, dp_group=None, fsdp: bool = False,
                   custom_functions: dict | None = None) -> Pipeline:
    """Wire a generated module's rank programs to this process's stage modules."""
    if not dist.is_initialized():
        raise PipelineError("torch.distributed is not initialized: call init_process_group first")
    size = dist.get_world_size(group)
    if size != info.ranks:
        raise PipelineError(f"schedule {info.name!r} runs on {info.ranks} ranks, the process group has {size}")
    rank = dist.get_rank(group) if rank is None else rank
    device = torch.device(device) if device is not None else _default_device(group)
    functions = checked_functions(custom_functions)
    runners = _runners(info, rank, stage_modules, loss_fn)
    replicas = _data_parallel(info, rank, stage_modules, dp_group, fsdp, device)
    wait = timedelta(seconds=timeout) if timeout is not None else None
    if _has_nccl(group) and device.type == "cuda":
        # every rank joins one collective first, so NCCL creates the group's communicator together
        # (a batch_isend_irecv that only some ranks enter first is undefined behaviour in NCCL)
        dist.all_reduce(torch.zeros(1, device=device), group=group)
    transport = Transport(group, rank, wait, device)
    return Pipeline(info, programs[rank], runners, transport, scale_grads=scale_grads, data_parallel=replicas,
                    functions=functions)


def _data_parallel(info: ScheduleInfo, rank: int, stage_modules: dict, dp_group, fsdp: bool, device) -> DataParallel:
    replicated = fsdp or dp_group is not None or any(map(is_sharded, stage_modules.values()))
    if replicated and len(info.placements) > 1:
        raise PipelineError(f"rank {rank}: data-parallel or FSDP stages with the bidirectional schedule "
                            f"{info.name!r} are not supported (its two replicas of a stage sum their gradients)")
    return data_parallel(rank, stage_modules, dp_group=dp_group, fsdp=fsdp, device=device)



def _has_nccl(group) -> bool:
    """NCCL alone, or NCCL for CUDA in a mixed group (``cpu:gloo,cuda:nccl``, torch's default)."""
    return "nccl" in str(dist.get_backend(group))


def _default_device(group) -> torch.device:
    """The device follows the backend: the current CUDA device under NCCL, else the CPU."""
    if _has_nccl(group) and torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _runners(info: ScheduleInfo, rank: int, stage_modules: dict[int, torch.nn.Module], loss_fn) -> dict:
    held = info.held(rank)
    wanted = sorted({stage for stage, _ in held})
    if sorted(stage_modules) != wanted:
        raise PipelineError(f"rank {rank} runs stages {wanted} of schedule {info.name!r}; "
                            f"stage_modules has {sorted(stage_modules)}")
    runners = {}
    for stage, chain in held:
        module = stage_modules[stage]
        if chain == 1 and (stage, 0) in held:
            module = copy.deepcopy(module)
        last = stage == info.stages - 1
        runners[(stage, chain)] = StageRunner(module, stage, chain, stage == 0, last, loss_fn if last else None)
    return runners
