"""Materialize the owned stages of a model built on the meta device, and only those.

``materialize(modules, every, names, ...)``: every distinct parameter and buffer of the owned stage
modules gets storage on ``device``, each part (embedding, each layer by its global index, norm, head)
initialized under its own seed (``part_seed(seed, name)``) with the model's own initializer, so any set
of owned stages holds the values the whole model, materialized the same way, holds; a tied group takes
its first entry's value; a ``state_dict`` then overwrites the values. The caller's random state is left
as it was. ``docs/models.md`` (Build only what you own).
"""

from __future__ import annotations

import copy
import zlib
from collections.abc import Callable, Mapping

import torch
from torch import nn

from pipeforge.errors import UsageError


def part_seed(seed: int, part: str) -> int:
    return zlib.crc32(f"{seed}:{part}".encode())


def parts(stage: nn.Module) -> list[tuple[str, nn.Module]]:
    """A stage module's parts, by their global names (``layers.5``)."""
    found = []
    for name, child in stage.named_children():
        if isinstance(child, nn.ModuleDict):
            found += [(f"{name}.{key}", sub) for key, sub in child.items()]
        else:
            found.append((name, child))
    return found


def materialize(modules: Mapping[int, nn.Module], every: Mapping[int, nn.Module], names: Mapping[tuple[int, str], str],
                groups: list[list[tuple[int, str]]], init: Callable[[nn.Module], None], *, seed: int,
                state_dict: Mapping[str, torch.Tensor] | None, device,
                whole: Callable[[], None] | None = None) -> None:
    """``whole``: what the model's initializer does for the model as a whole, after its parts (Falcon-H1's base
    model gives every layer's Mamba mixer its ``mup_vector``), under its own seed."""
    device = torch.device(device)
    _allocate(modules.values(), device)
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []), torch.no_grad():
        done: set[int] = set()
        for stage in sorted(modules):
            for part, module in parts(modules[stage]):
                if id(module) not in done:
                    done.add(id(module))
                    initialize(module, part, init, seed)
        if whole is not None:
            torch.manual_seed(part_seed(seed, "whole"))
            whole()
        for group in groups:
            _tie_values(group, modules, every, init, seed, device)
    if state_dict is not None:
        _load(modules, names, state_dict)


def initialize(module: nn.Module, part: str, init: Callable[[nn.Module], None], seed: int) -> None:
    """``init`` on every submodule, children first, under the part's seed and with the part's floating dtype
    as torch's default (as the model was built: a table an initializer computes, GPT-J's sinusoids, then has
    the precision the model's own construction gives it), both restored after."""
    torch.manual_seed(part_seed(seed, part))
    dtype = next((t.dtype for t in [*module.parameters(), *module.buffers()] if t.dtype in _DEFAULTABLE), None)
    before = torch.get_default_dtype()
    torch.set_default_dtype(dtype or before)
    try:
        for sub in _children_first(module):
            init(sub)
    finally:
        torch.set_default_dtype(before)


_DEFAULTABLE = (torch.float32, torch.float64)  # the dtypes torch.set_default_dtype takes here


def _children_first(module: nn.Module) -> list[nn.Module]:
    order = []
    for child in module.children():
        order += _children_first(child)
    return order + [module]


def _allocate(modules, device: torch.device) -> None:
    """Storage for every meta tensor; a tensor several modules hold stays one tensor."""
    new: dict[int, torch.Tensor] = {}
    for module in modules:
        for sub in module.modules():
            for key, param in list(sub._parameters.items()):
                if param is not None and param.is_meta:
                    if id(param) not in new:
                        new[id(param)] = nn.Parameter(torch.empty_like(param, device=device),
                                                      requires_grad=param.requires_grad)
                    sub._parameters[key] = new[id(param)]
            for key, buffer in list(sub._buffers.items()):
                if buffer is not None and buffer.is_meta:
                    if id(buffer) not in new:
                        new[id(buffer)] = torch.empty_like(buffer, device=device)
                    sub._buffers[key] = new[id(buffer)]
            for attr in ("original_inv_freq",):  # rotary tables kept as plain attributes
                value = getattr(sub, attr, None)
                if isinstance(value, torch.Tensor) and value.is_meta:
                    setattr(sub, attr, torch.empty_like(value, device=device))


def _tie_values(group, modules, every, init, seed: int, device) -> None:
    """Every owned copy of a tied group gets the value its first entry's part initializes."""
    owned = [(s, n) for s, n in group if s in modules]
    if not owned:
        return
    value = _built_aside(every, group[0], init, seed, device)  # also where a later part overwrote it
    for s, n in owned:
        param = modules[s].get_parameter(n)
        param.copy_(value)


def _built_aside(every, source: tuple[int, str], init, seed: int, device) -> torch.Tensor:
    """The source part of a tie, materialized on its own (its stage is not owned here)."""
    stage, name = source
    for part, module in parts(every[stage]):
        if name.startswith(part + "."):
            aside = copy.deepcopy(module).to_empty(device=device)
            initialize(aside, part, init, seed)
            return aside.get_parameter(name[len(part) + 1:]).detach()
    raise UsageError(f"pipeforge.split: cannot build the tied parameter {name!r} of stage {stage} aside")


def _load(modules, names, state_dict) -> None:
    from pipeforge.models.checkpoint import values

    state_dict = values(state_dict)
    missing = []
    with torch.no_grad():
        for stage, module in modules.items():
            for name, param in module.named_parameters():
                model_name = names.get((stage, name))
                if model_name not in state_dict:
                    missing.append(f"{model_name or name} (stage {stage} {name!r})")
                    continue
                param.copy_(state_dict[model_name])
    if missing:
        raise UsageError(f"pipeforge.split: state_dict lacks {len(missing)} parameter(s) of the owned stages: "
                         + ", ".join(missing[:5]))
