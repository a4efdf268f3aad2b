"""Data parallelism of a rank's stages: FSDP2 unshard/reshard and gradient reduction.

``data_parallel(rank, stage_modules, dp_group=..., fsdp=...)`` -> ``DataParallel``: per stage, FSDP2
modules (``ShardedParams``: UNSHARD starts ``unshard(async_op=True)``, RESHARD reshards, REDUCE_GRAD runs
FSDP's post-backward), plain modules with a ``dp_group`` (``ReplicatedParams``: one asynchronous
all-reduce, averaged), or nothing. Gradients are the same with or without REDUCE_GRAD in the schedule
(a stage without one is reduced at the end of ``step()``), every FSDP stage is resharded at the end of
``step()`` and ``eval()``, and one parameter shared by two stages of a rank is refused. The table per
kind of stage: ``docs/runtime-fsdp.md``; FSDP's private calls: ``docs/runtime-internals.md``.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

from pipeforge.runtime.p2p import PipelineError, PipelineUsageError

if TYPE_CHECKING:
    from torch.distributed.fsdp import FSDPModule


class StageParams:
    """A stage without data parallelism: UNSHARD, RESHARD and REDUCE_GRAD have nothing to do."""

    sharded = False

    def __init__(self, stage: int, module: torch.nn.Module):
        self.stage = stage
        self.module = module

    def begin(self, training: bool) -> None:
        pass

    def unshard(self) -> None:
        pass

    def reshard(self) -> None:
        pass

    def before_compute(self, backward: bool) -> None:
        pass

    def after_weight_gradients(self) -> None:
        pass

    def start_reduce(self) -> None:
        pass

    def finish_reduce(self) -> None:
        pass

    def end(self) -> None:
        pass


class ShardedParams(StageParams):
    """A stage holding FSDP2 modules: unshard/reshard/reduce-scatter through FSDP's own API."""

    sharded = True

    def __init__(self, stage: int, module: torch.nn.Module):
        super().__init__(stage, module)
        self.fsdp_modules = fsdp_modules(module)
        self.states = _distinct_states(self.fsdp_modules)
        self.groups = [group for state in self.states for group in state._fsdp_param_groups]
        self.roots = _root_states(self.fsdp_modules)
        self.gathering: list = []  # the param groups whose all-gather an UNSHARD started, until waited
        self.unsharded = False
        self.reducing = False
        self.upcast: list = []  # FSDP params whose gradients accumulate in another dtype (mixed precision)

    def begin(self, training: bool) -> None:
        for group in self.groups:  # what FSDPModule.unshard does before every all-gather: once a step here
            group.lazy_init()
        self.upcast = [param for group in self.groups for param in group.fsdp_params
                       if param.reduce_dtype is not None]
        if training:  # microbatches accumulate unsharded gradients; REDUCE_GRAD reduces them once
            for fsdp in self.fsdp_modules:
                fsdp.set_requires_gradient_sync(False, recurse=False)
                fsdp.set_is_last_backward(False)
                fsdp.set_reshard_after_backward(False, recurse=False)

    def unshard(self) -> None:
        """Start every param group's all-gather (``FSDPModule.unshard(async_op=True)`` of each module,
        its lazy initialization done once a step in ``begin``); the next compute waits for them."""
        if self.gathering or self.unsharded:
            raise PipelineError(f"stage {self.stage}: UNSHARD while its parameters are already unsharded "
                                "(a RESHARD must come between two UNSHARDs)")
        for group in self.groups:
            group.unshard(async_op=True)
        self.gathering = self.groups
        self.unsharded = True

    def reshard(self) -> None:
        self._wait_unshard()
        for fsdp in self.fsdp_modules:
            fsdp.reshard()
        self.unsharded = False

    def before_compute(self, backward: bool) -> None:
        if self.gathering:
            self._wait_unshard()
        # F's pre-forward hook unshards by itself; the split backward needs the unsharded weights. Asking
        # each param group (not FSDPModule.unshard, which lazily initializes every time) keeps the common
        # case, a stage an UNSHARD already gathered, to one attribute read per group.
        if backward and not all(group.is_unsharded for group in self.groups):
            for fsdp in self.fsdp_modules:
                fsdp.unshard()

    def after_weight_gradients(self) -> None:
        """After a B or W: under a ``MixedPrecisionPolicy`` whose ``reduce_dtype`` differs from its
        ``param_dtype``, move this microbatch's weight gradients into FSDP's accumulator in the reduce dtype
        (what FSDP's post-backward does per backward). FSDP's hook runs when the inputs' gradients are
        done, so after an I, before the W that makes the weight gradients: without this, the W of several
        microbatches would sum in ``param_dtype`` first (bfloat16), unlike the unpipelined model."""
        for param in self.upcast:
            param.accumulate_unsharded_grad_if_needed()
            param.to_accumulated_grad_if_needed()

    def start_reduce(self) -> None:
        self._wait_unshard()
        for fsdp in self.fsdp_modules:
            fsdp.set_requires_gradient_sync(True, recurse=False)
            fsdp.set_reshard_after_backward(True, recurse=False)
            fsdp.set_is_last_backward(True)
        for group in self.groups:
            group.post_backward()  # starts the reduce-scatter of this group's gradients
        self.reducing = True

    def finish_reduce(self) -> None:
        if not self.reducing:
            return
        for root_state in self.roots:
            root_state._root_post_backward_final_callback()
        self.reducing = False
        self.unsharded = False

    def end(self) -> None:
        self._wait_unshard()
        for group in self.groups:
            group.reshard()  # FSDPModule.reshard of each module, without looking the groups up again
        self.unsharded = False

    def _wait_unshard(self) -> None:
        groups, self.gathering = self.gathering, []
        for group in groups:
            group.wait_for_unshard()


def _distinct_states(modules: list[FSDPModule]) -> list:
    """The FSDP states of ``modules`` (fully_shard's or replicate's), each once."""
    seen: dict[int, object] = {}
    for fsdp in modules:
        state = fsdp._get_fsdp_state()
        seen.setdefault(id(state), state)
    return list(seen.values())


def _root_states(modules: list[FSDPModule]) -> list:
    """The FSDP states of the outermost FSDP modules of a stage (each the root of its tree)."""
    inner = {id(sub) for fsdp in modules if isinstance(fsdp, torch.nn.Module)  # (each is: fully_shard's)
             for sub in fsdp.modules() if sub is not fsdp}
    return [fsdp._get_fsdp_state() for fsdp in modules if id(fsdp) not in inner]


class ReplicatedParams(StageParams):
    """A plain stage replicated over ``group``: one asynchronous all-reduce of its gradients per step."""

    def __init__(self, stage: int, module: torch.nn.Module, group):
        super().__init__(stage, module)
        self.group = group
        self.pending: tuple | None = None

    def start_reduce(self) -> None:
        params = [p for p in self.module.parameters() if p.requires_grad]
        if not params:
            return
        flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in params])
        work = dist.all_reduce(flat, group=self.group, async_op=True)
        self.pending = (work, flat, params)

    def finish_reduce(self) -> None:
        if self.pending is None:
            return
        work, flat, params = self.pending
        self.pending = None
        work.wait()
        flat.div_(dist.get_world_size(self.group))
        offset = 0
        for param in params:
            param.grad = flat[offset: offset + param.numel()].view_as(param).clone()
            offset += param.numel()


@dataclass
class DataParallel:
    """Every stage of this rank with how its parameters are held; what UNSHARD, RESHARD, REDUCE_GRAD do."""

    rank: int
    stages: dict[int, StageParams]
    reduced: set[int] = field(default_factory=set)
    training: bool = True
    upcasting: set[int] = field(default_factory=set)  # stages whose B and W move gradients to reduce_dtype

    @cached_property
    def idle(self) -> bool:
        """No stage of this rank has anything to do at a step's begin and end (none replicated or sharded)."""
        return all(type(params) is StageParams for params in self.stages.values())

    def begin(self, training: bool) -> None:
        self.training = training
        self.reduced.clear()
        if self.idle:
            return
        for params in self.stages.values():
            params.begin(training)
        self.upcasting = {stage for stage, params in self.stages.items()
                          if isinstance(params, ShardedParams) and params.upcast}  # (the one sharded kind)

    @cached_property
    def hooks_compute(self) -> bool:
        """Whether a compute action needs ``before_compute``/``after_weight_gradients`` (an FSDP stage)."""
        return not self.idle and any(params.sharded for params in self.stages.values())

    def unshard(self, stage: int) -> None:
        self._of(stage, "UNSHARD").unshard()

    def reshard(self, stage: int) -> None:
        self._of(stage, "RESHARD").reshard()

    def before_compute(self, stage: int, backward: bool) -> None:
        self._of(stage, "a compute").before_compute(backward)

    def after_weight_gradients(self, stage: int) -> None:
        self._of(stage, "a compute").after_weight_gradients()

    def reduce(self, stage: int) -> None:
        """REDUCE_GRAD: start the stage's gradient reduction (once per step)."""
        params = self._of(stage, "REDUCE_GRAD")
        if stage in self.reduced:
            raise PipelineError(f"rank {self.rank}: REDUCE_GRAD of stage {stage} twice in one step")
        self.reduced.add(stage)
        if self.training:
            params.start_reduce()

    def end(self) -> None:
        """After the program: reduce the stages the schedule did not, wait for every reduction, reshard."""
        if self.idle:
            return
        if self.training:
            for stage in sorted(set(self.stages) - self.reduced):
                self.stages[stage].start_reduce()
            for params in self.stages.values():
                params.finish_reduce()
        for params in self.stages.values():
            params.end()

    def _of(self, stage: int, what: str) -> StageParams:
        params = self.stages.get(stage)
        if params is None:
            raise PipelineError(f"rank {self.rank} holds no replica of stage {stage} ({what})")
        return params


def data_parallel(rank: int, stage_modules: dict[int, torch.nn.Module], *, dp_group=None, fsdp: bool = False,
                  device: torch.device | None = None) -> DataParallel:
    """How each stage of this rank is replicated; with ``fsdp`` plain modules are sharded over ``dp_group``."""
    if fsdp and dp_group is None:
        raise PipelineError(f"rank {rank}: fsdp=True shards the stages over dp_group; pass dp_group=")
    if fsdp or dp_group is not None:
        _refuse_shared_parameters(rank, stage_modules, fsdp)
    mesh = None
    stages: dict[int, StageParams] = {}
    for stage, module in sorted(stage_modules.items()):
        _refuse_ddp(rank, stage, module)
        if fsdp and not is_sharded(module):
            mesh = mesh or _mesh(dp_group, device)
            _fully_shard()(module, mesh=mesh, reshard_after_forward=False)
        if is_sharded(module):
            stages[stage] = ShardedParams(stage, module)
        elif dp_group is not None:
            stages[stage] = ReplicatedParams(stage, module, dp_group)
        else:
            stages[stage] = StageParams(stage, module)
    return DataParallel(rank, stages)


def fsdp_modules(module: torch.nn.Module) -> list[FSDPModule]:
    """The FSDP2 modules in ``module`` (none unless FSDP was imported: it costs seconds per process)."""
    fsdp = sys.modules.get("torch.distributed.fsdp")
    if fsdp is None:
        return []
    kind: type[FSDPModule] = fsdp.FSDPModule
    return [m for m in module.modules() if isinstance(m, kind)]


def is_sharded(module: torch.nn.Module) -> bool:
    return bool(fsdp_modules(module))


def _fully_shard():
    from torch.distributed.fsdp import fully_shard

    return fully_shard


def _refuse_shared_parameters(rank: int, stage_modules: dict[int, torch.nn.Module], fsdp: bool) -> None:
    """Each stage is sharded (``fully_shard``) and reduced on its own: a parameter two stages of this rank
    share would be sharded twice, or reduced once per stage at two times (the first before the other
    stage's backward is done). Refused, naming both stages: give each its own copy and tie them."""
    how = ("fsdp=True shards each stage on its own (FSDP2 cannot shard one parameter in two modules)" if fsdp
           else "dp_group= reduces each stage's gradients on its own, at its REDUCE_GRAD")
    owner: dict[int, tuple[int, str]] = {}
    for stage, module in sorted(stage_modules.items()):
        for name, param in module.named_parameters():
            first = owner.setdefault(id(param), (stage, name))
            if first[0] != stage:
                raise PipelineUsageError(
                    f"rank {rank}: stage {first[0]} ({first[1]!r}) and stage {stage} ({name!r}) share one parameter, "
                    f"and {how}: give each stage its own copy and name them in make_pipeline(tied_parameters=...)")


def _refuse_ddp(rank: int, stage: int, module: torch.nn.Module) -> None:
    if isinstance(module, torch.nn.parallel.DistributedDataParallel):
        raise PipelineError(f"rank {rank}: stage {stage} is a DistributedDataParallel module; pass the plain "
                            "module with dp_group= (its gradients are all-reduced once a step) or shard it "
                            "with fully_shard")


def _mesh(group, device: torch.device | None):
    from torch.distributed.device_mesh import DeviceMesh

    return DeviceMesh.from_group(group, device_type=(device.type if device is not None else "cpu"))
