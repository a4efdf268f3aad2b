"""Gradients after a rank's program: replicas summed across chains, tied parameters summed across ranks.

``distinct_parameters(modules)``: each parameter once, however many stage modules hold it; ``divide``: the
step's gradients divided by the microbatch count, as ``div_`` divides them. The pieces the
pipeline sums replicas with (``add_local``: two replicas on one rank; ``exchange_with``, ``flat_grads``,
``add_flat``: across ranks) and checks that copies start equal (``check_same_start``).
``TiedParameters``: groups of ``(stage, parameter name)`` that are one parameter of the model
(``make_pipeline(tied_parameters=...)``) start equal (``check_equal``) and end each step with the same
summed gradient, bit for bit, FSDP shards shard by shard. How: ``docs/runtime-internals.md``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from pipeforge.runtime.p2p import PipelineUsageError, TensorMeta, Transfer, Transport, decode_header, encode_header, \
    empty_header

if TYPE_CHECKING:
    from pipeforge.runtime.context import ScheduleInfo


def distinct_parameters(modules: Iterable[torch.nn.Module]) -> list[torch.nn.Parameter]:
    """Every parameter of ``modules`` once, in order of first appearance."""
    seen: dict[int, torch.nn.Parameter] = {}
    visited: set[int] = set()
    for module in modules:  # module.parameters()'s order, without the names it builds for every one
        _collect(module, visited, seen)
    return list(seen.values())


def _collect(module: torch.nn.Module, visited: set[int], seen: dict[int, torch.nn.Parameter]) -> None:
    """The parameters of ``module`` and its submodules into ``seen``, in ``module.modules()``'s order (depth
    first, each module once), without the names ``named_modules`` builds for every submodule."""
    if id(module) in visited:
        return
    visited.add(id(module))
    for param in module._parameters.values():
        if param is not None:
            seen.setdefault(id(param), param)
    for child in module._modules.values():
        if child is not None:
            _collect(child, visited, seen)


FEW_GRADIENTS = 8  # CPU gradients divided a call each (more: one ``_foreach_div_``)
_DIVISORS: dict[int, torch.Tensor] = {}  # ``divide``'s divisors as float64 0-dimensional CPU tensors


def divide(grads: list[torch.Tensor], divisor: int) -> None:
    """Every tensor of ``grads`` divided in place by ``divisor``, bit for bit as ``grad.div_(float(divisor))``
    (autograd off: the caller's). A CPU tensor of one dimension or more is divided by ``divisor`` as a float64
    0-dimensional tensor, which takes no part in the result's dtype and holds any divisor a Python float
    does, so the quotient is the number's, without the number wrapped into a tensor at every call (a
    0-dimensional gradient would be divided in float64 there: it, and any other, is divided by the number).
    A few are divided a call each, more with one ``_foreach_div_``."""
    on_cpu = [g for g in grads if g.is_cpu and g.dim()]
    others = [g for g in grads if not (g.is_cpu and g.dim())] if len(on_cpu) < len(grads) else []
    if on_cpu:
        by = _DIVISORS.get(divisor)
        if by is None or by._version:
            by = _DIVISORS[divisor] = torch.tensor(float(divisor), dtype=torch.float64)
        if len(on_cpu) <= FEW_GRADIENTS:
            for grad in on_cpu:
                grad.div_(by)
        else:
            torch._foreach_div_(on_cpu, by)
    if others:  # one call, each divided as div_ would (one kernel for all on a GPU)
        torch._foreach_div_(others, float(divisor))


def trained(module: torch.nn.Module) -> list[torch.nn.Parameter]:
    return [p for p in module.parameters() if p.requires_grad]


def flat_grads(params: list[torch.nn.Parameter]) -> torch.Tensor:
    if not params:
        return torch.zeros(0)
    return torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in params])


def add_flat(params: list[torch.nn.Parameter], incoming: torch.Tensor) -> None:
    offset = 0
    for param in params:
        part = incoming[offset: offset + param.numel()].view_as(param)
        offset += param.numel()
        param.grad = part.clone() if param.grad is None else param.grad + part


def add_local(original: torch.nn.Module, replica: torch.nn.Module) -> None:
    """Two replicas of a stage on one rank: both end with the sum of their gradients."""
    for mine, theirs in zip(trained(original), trained(replica)):
        if theirs.grad is None:
            continue
        mine.grad = theirs.grad.clone() if mine.grad is None else mine.grad + theirs.grad
    for mine, theirs in zip(trained(original), trained(replica)):
        theirs.grad = None if mine.grad is None else mine.grad.clone()


def exchange_with(transport: Transport, outgoing: dict[int, torch.Tensor], label: str) -> dict[int, torch.Tensor]:
    """Send ``outgoing[peer]`` to each peer and receive one tensor of the same shape from each."""
    incoming = {peer: torch.empty_like(tensor) for peer, tensor in outgoing.items()}
    transfers = [t for peer in sorted(outgoing)
                 for t in (Transfer(True, outgoing[peer], peer), Transfer(False, incoming[peer], peer))]
    transport.exchange(transfers, label)
    return incoming


def exchange_metas(transport: Transport, outgoing: dict[int, torch.Tensor], label: str) -> dict[int, TensorMeta]:
    """Shapes and dtypes first, so tensors that do not fit are named instead of breaking the transfer."""
    headers = {peer: encode_header([TensorMeta.of(t)], transport.device) for peer, t in outgoing.items()}
    incoming = {peer: empty_header(transport.device) for peer in outgoing}
    transfers = [t for peer in sorted(outgoing)
                 for t in (Transfer(True, headers[peer], peer), Transfer(False, incoming[peer], peer))]
    transport.exchange(transfers, label)
    return {peer: decode_header(header)[0] for peer, header in incoming.items()}


def check_same_start(transport: Transport, mine: torch.Tensor, peers: list[int], what: str, fix: str) -> None:
    """``mine`` equals the tensor each peer passes for the same ``what`` (every side raises if not)."""
    if not peers:
        return
    metas = exchange_metas(transport, {peer: mine for peer in peers}, f"the shapes of {what}")
    for peer, meta in metas.items():
        if meta != TensorMeta.of(mine):
            raise PipelineUsageError(f"rank {transport.rank}: {what} has shape {list(mine.shape)} {mine.dtype} here "
                                     f"and {list(meta.shape)} {meta.dtype} on rank {peer}; {fix}")
    theirs = exchange_with(transport, {peer: mine for peer in peers}, f"the values of {what}")
    for peer, value in sorted(theirs.items()):
        if not torch.equal(value, mine):
            difference = (value.double() - mine.double()).abs().max().item()
            raise PipelineUsageError(f"rank {transport.rank}: {what} differs from rank {peer}'s copy (largest "
                                     f"difference {difference:.3g}); {fix}")


TiedEntry = tuple[int, str]


@dataclass(frozen=True)
class TiedParameters:
    """Groups of ``(stage, parameter name)`` pairs that are one parameter of the model."""

    groups: tuple[tuple[TiedEntry, ...], ...] = ()

    @staticmethod
    def parse(value: object, stages: int, rank: int) -> TiedParameters:
        """``tied_parameters`` as given to ``make_pipeline``, checked (errors name the group and entry)."""
        if value is None:
            return TiedParameters()
        if isinstance(value, (str, bytes, Mapping)) or not isinstance(value, Iterable):
            raise PipelineUsageError(f"rank {rank}: tied_parameters must be a list of groups, each a list of "
                                     f"(stage, parameter name) pairs, e.g. [[(0, 'embed.weight'), ({stages - 1}, "
                                     f"'head.weight')]]; got {type(value).__name__}")
        return TiedParameters(tuple(_parse_group(group, index, stages, rank) for index, group in enumerate(value)))

    @staticmethod
    def holders(group: tuple[TiedEntry, ...], info: ScheduleInfo) -> list[int]:
        """Every rank holding a replica (in any chain) of a stage of ``group``."""
        stages = {stage for stage, _ in group}
        return [rank for rank in range(info.ranks) if any(s in stages for s, _ in info.held(rank))]

    @staticmethod
    def local(group: tuple[TiedEntry, ...], modules: Mapping[int, torch.nn.Module], rank: int,
              only: Callable[[int], bool] = lambda stage: True) -> list[torch.nn.Parameter]:
        """This rank's distinct parameters of ``group`` (one parameter held by two stages counts once)."""
        found: dict[int, torch.nn.Parameter] = {}
        for stage, name in group:
            if stage in modules and only(stage):
                param = _lookup(modules[stage], stage, name, rank)
                found.setdefault(id(param), param)
        return list(found.values())

    def check_equal(self, transport: Transport, modules: Mapping[int, torch.nn.Module], info: ScheduleInfo) -> None:
        """Every copy of a tied parameter starts with the same value (on one rank and across ranks).

        A rank that finds a problem of its own (a name its stage lacks, copies that differ on it) still
        takes part in the exchange with a copy no peer can match, so every holder raises, none waits."""
        for index, group in enumerate(self.groups):
            peers = [r for r in self.holders(group, info) if r != transport.rank]
            what = f"tied parameter group {index} {_describe(group)}"
            fix = "tied copies must start equal: initialize them from one seed, or copy one into the others"
            try:
                local = self.local(group, modules, transport.rank)
                problem = None
            except PipelineUsageError as error:
                local, problem = [], error
            if not local and problem is None:
                continue
            shards = [_local_value(p) for p in local]
            if shards and any(p.shape != shards[0].shape or not torch.equal(p, shards[0]) for p in shards[1:]):
                problem = PipelineUsageError(f"rank {transport.rank}: {what}: its copies on this rank differ; {fix}")
            mine = shards[0] if problem is None else torch.full((1,), float("nan"), device=transport.device)
            try:
                check_same_start(transport, mine, peers, what, fix)
            except PipelineUsageError:
                if problem is None:
                    raise
            if problem is not None:
                raise problem

    def sum_gradients(self, transport: Transport, modules: Mapping[int, torch.nn.Module],
                      info: ScheduleInfo) -> None:
        """Every copy of each tied parameter ends with the group's summed gradient (same bits on every rank).

        Each stage's gradient counts once: the rank running its chain-0 replica contributes it (after
        ``reduce_chains`` both replicas of a stage hold the same sum)."""
        rank = transport.rank
        for index, group in enumerate(self.groups):
            local = self.local(group, modules, rank)
            if not local:
                continue
            mine = self.local(group, modules, rank, only=lambda stage: info.rank_of(stage, 0) == rank)
            partial = _sum([_local_grad(p) for p in mine] or [torch.zeros_like(_local_value(local[0]))])
            peers = [r for r in self.holders(group, info) if r != rank]
            theirs = exchange_with(transport, {peer: partial for peer in peers},
                                   f"the gradient sum of tied parameter group {index}") if peers else {}
            theirs[rank] = partial
            total = _sum([theirs[r] for r in sorted(theirs)])
            for param in local:
                _set_grad(param, total)


def local(tensor: torch.Tensor) -> torch.Tensor:
    """This rank's shard of an FSDP2 parameter or gradient (a DTensor); a plain tensor as it is."""
    to_local = getattr(tensor, "to_local", None)
    return to_local() if to_local is not None else tensor


def _set_grad(param: torch.nn.Parameter, total: torch.Tensor) -> None:
    """``param.grad`` becomes ``total`` (its local shard, for a DTensor parameter)."""
    if not hasattr(param, "to_local"):
        param.grad = total.clone()
        return
    from torch.distributed.tensor import DTensor

    assert isinstance(param, DTensor), "a parameter with to_local is a DTensor (FSDP's)"
    param.grad = DTensor.from_local(total.clone(), param.device_mesh, param.placements, run_check=False,
                                    shape=param.shape, stride=param.stride())


def _local_value(param: torch.nn.Parameter) -> torch.Tensor:
    return local(param.detach()).contiguous()


def _local_grad(param: torch.nn.Parameter) -> torch.Tensor:
    return local(param.grad).contiguous() if param.grad is not None else torch.zeros_like(_local_value(param))


def _sum(tensors: list[torch.Tensor]) -> torch.Tensor:
    total = tensors[0].clone()
    for tensor in tensors[1:]:
        total += tensor
    return total


def _parse_group(group: object, index: int, stages: int, rank: int) -> tuple[TiedEntry, ...]:
    where = f"rank {rank}: tied_parameters group {index}"
    if isinstance(group, (str, bytes)) or not isinstance(group, Iterable):
        raise PipelineUsageError(f"{where} must be a list of (stage, parameter name) pairs; got {group!r}")
    entries = tuple(group)
    for entry in entries:
        if not (isinstance(entry, tuple) and len(entry) == 2 and isinstance(entry[0], int)
                and isinstance(entry[1], str)):
            raise PipelineUsageError(f"{where}: {entry!r} is not a (stage, parameter name) pair")
        if not 0 <= entry[0] < stages:
            raise PipelineUsageError(f"{where}: stage {entry[0]} of {entry!r} is out of range (stages 0..{stages - 1})")
    if len(set(entries)) < 2:
        raise PipelineUsageError(f"{where} names {len(set(entries))} distinct parameter(s); a tie needs two or more")
    return entries


def _lookup(module: torch.nn.Module, stage: int, name: str, rank: int) -> torch.nn.Parameter:
    try:
        return module.get_parameter(name)
    except AttributeError:
        names = [n for n, _ in module.named_parameters()][:8]
        raise PipelineUsageError(f"rank {rank}: tied_parameters names {name!r} of stage {stage}, which has no "
                                 f"such parameter (it has {', '.join(map(repr, names))}...)") from None


def _describe(group: tuple[TiedEntry, ...]) -> str:
    return "(" + ", ".join(f"stage {stage} {name!r}" for stage, name in group) + ")"
