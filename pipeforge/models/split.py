"""``pipeforge.split``: a model cut into the stage modules of a pipeline, with its ties.

    cut = pipeforge.split(model, stages, owned=None, layers=None, costs=None)
    cut.modules            # {stage: nn.Module} for the owned stages (all when owned is None)
    cut.tied_parameters    # what make_pipeline(tied_parameters=...) takes
    cut.layers             # the global layer indices of each stage

It cuts a Hugging Face causal LM (``models/hf.py``), an ``nn.Sequential``, or a module of some modules,
one ``nn.ModuleList`` and some more; layers per stage given, balanced by ``costs``, or even; a torch
``pipeline()`` ``Pipe`` at its own cut (``models/torch_pipe.py``). A
parameter two stages hold is one ``tied_parameters`` group (``untie=True``: a copy per stage). A meta
model is materialized for the owned stages only, from per-part seeds or a ``state_dict``
(``models/checkpoint.py``). The whole contract: ``docs/models.md``.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
from torch import nn

from pipeforge.errors import UsageError
from pipeforge.models import hf, torch_pipe
from pipeforge.models.plain import LayerListStage, list_parts

if TYPE_CHECKING:
    from transformers import PreTrainedModel


@dataclass
class Split:
    """The cut: stage modules of the owned stages, tied groups, and the layers of every stage."""

    modules: dict[int, nn.Module]
    tied_parameters: list[list[tuple[int, str]]]
    layers: list[range]
    stages: int
    names: dict[tuple[int, str], str] = field(default_factory=dict)  # (stage, name) -> the model's name


def split(model: nn.Module, stages: int, *, owned: Sequence[int] | None = None,
          layers: Sequence[int] | None = None, costs=None, untie: bool = False,
          seed: int = 0, state_dict=None,
          device: torch.device | str | None = None, aux_loss: bool = True, verify: bool = True) -> Split:
    """Cut ``model`` into ``stages`` stage modules; see the module docstring. ``stages`` may also be a
    generated module's ``SCHEDULE``: its stage count, and ``untie`` when it runs two chains (Chimera)."""
    if hasattr(stages, "placements") and hasattr(stages, "stages"):
        untie = untie or len(stages.placements) > 1
        stages = stages.stages
    if not isinstance(stages, int) or stages < 1:
        raise UsageError(f"pipeforge.split: stages must be a positive integer, got {stages!r}")
    owned = list(range(stages)) if owned is None else sorted(set(owned))
    bad = [s for s in owned if not isinstance(s, int) or not 0 <= s < stages]
    if bad:
        raise UsageError(f"pipeforge.split: owned stages {bad} are out of range (stages 0..{stages - 1})")
    if torch_pipe.is_torch_pipe(model):
        if layers is not None or costs is not None or state_dict is not None:
            raise UsageError("pipeforge.split: a torch Pipe is split where pipeline() cut it; layers, costs and "
                             "state_dict do not apply to it")
        return _split_pipe(model, stages, owned, untie, device, verify)
    build: Callable[[int], nn.Module]
    whole: Callable[[], None] | None
    if hf.is_causal_lm(model):
        model.config.use_cache = False
        parts = hf.parts_of(model)
        count = len(parts.layers)
        bounds = _bounds(count, stages, layers, costs)
        build = lambda s: hf.CausalLMStage(parts, bounds[s].start, bounds[s].stop, s == 0, s == stages - 1,
                                           aux_loss=aux_loss)
        init = _hf_init(model)
        base = hf.base_model(model)[1]
        whole = lambda: model._init_weights(base)  # what it does for the base as a whole (on its meta layers: nothing)
    else:
        pre, blocks, post = list_parts(model)
        bounds = _bounds(len(blocks), stages, layers, costs)
        build = lambda s: LayerListStage(pre if s == 0 else [], blocks, bounds[s], post if s == stages - 1 else [])
        init, whole = _reset_parameters, None
    every: dict[int, nn.Module] = {s: build(s) for s in range(stages)}
    names = _model_names(model, every)
    groups = _tied_groups(model, every, names)
    modules = {s: every[s] for s in owned}
    if untie:
        modules = _untied(modules)
    if _on_meta(modules) or state_dict is not None:
        from pipeforge.models.materialize import materialize

        materialize(modules, every, names, groups, init, seed=seed, state_dict=state_dict,
                    device=device or "cpu", whole=whole)
    if verify:
        from pipeforge.models.verify_cut import verify_cut, warn_unchecked

        if _on_meta({0: model}):
            warn_unchecked(model)
        else:
            verify_cut(model, every)
    return Split(modules, groups, bounds, stages, {key: name for key, name in names.items() if key[0] in modules})


def _split_pipe(pipe, stages: int, owned: list[int], untie: bool, device, verify: bool) -> Split:
    every, groups = torch_pipe.cut_pipe(pipe, stages, verify=verify)
    modules: dict[int, nn.Module] = {s: every[s] for s in owned}
    if untie:
        modules = _untied(modules)
    if device is not None:
        for module in modules.values():
            torch_pipe.move_to(module, torch.device(device))
    names = {(s, name): name for s, module in modules.items() for name, _ in module.named_parameters()}
    return Split(modules, groups, [], stages, names)


def _bounds(count: int, stages: int, layers: Sequence[int] | None, costs) -> list[range]:
    if layers is not None:
        layers = list(layers)
        if len(layers) != stages or any(not isinstance(n, int) or n < 0 for n in layers) or sum(layers) != count:
            raise UsageError(f"pipeforge.split: layers={layers} must give {stages} counts (one per stage, each >= 0) "
                             f"summing to the model's {count} layers")
        starts = [sum(layers[:s]) for s in range(stages + 1)]
        return [range(starts[s], starts[s + 1]) for s in range(stages)]
    if costs is not None:
        from pipeforge.models.balance import balanced_bounds

        return balanced_bounds(costs, count, stages)
    if stages > count:
        raise UsageError(f"pipeforge.split: {stages} stages need at least as many layers (the model has {count}); "
                         "give layers= to leave some stages without layers")
    edges = [round(s * count / stages) for s in range(stages + 1)]
    return [range(edges[s], edges[s + 1]) for s in range(stages)]


def _model_names(model: nn.Module, every: dict[int, nn.Module]) -> dict[tuple[int, str], str]:
    """(stage, stage-relative name) -> the parameter's first name in the model."""
    first_name: dict[int, str] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        first_name.setdefault(id(param), name)
    return {(stage, name): first_name[id(param)] for stage, module in every.items()
            for name, param in module.named_parameters(remove_duplicate=False) if id(param) in first_name}


def _tied_groups(model: nn.Module, every: dict[int, nn.Module], names) -> list[list[tuple[int, str]]]:
    """Groups of (stage, name) that are one parameter of the model, held by two or more stages."""
    by_param: dict[str, list[tuple[int, str]]] = {}
    for (stage, name), model_name in names.items():
        by_param.setdefault(model_name, []).append((stage, name))
    ties = getattr(model, "all_tied_weights_keys", None) or {}
    model_names = {name for name, _ in model.named_parameters(remove_duplicate=False)}
    first: dict[int, str] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        first.setdefault(id(param), name)
    canonical = {name: first[id(param)] for name, param in model.named_parameters(remove_duplicate=False)}
    for target, source in ties.items():  # declared ties whose copies are distinct parameters
        if target in model_names and source in model_names and canonical[target] != canonical[source]:
            by_param.setdefault(canonical[source], []).extend(by_param.pop(canonical[target], []))
    groups = []
    for entries in by_param.values():
        firsts: dict[int, tuple[int, str]] = {}
        for stage, name in entries:
            firsts.setdefault(stage, (stage, name))
        if len(firsts) > 1:
            groups.append(sorted(firsts.values()))
    return sorted(groups)


def _untied(modules: dict[int, nn.Module]) -> dict[int, nn.Module]:
    """Each stage its own copy of a parameter several owned stages share."""
    seen: set[int] = set()
    result = {}
    for stage, module in sorted(modules.items()):
        shared = {id(p) for p in module.parameters()} & seen
        seen |= {id(p) for p in module.parameters()}
        result[stage] = _copy_parameters(module, shared) if shared else module
    return result


def _copy_parameters(module: nn.Module, shared: set[int]) -> nn.Module:
    memo: dict[int, object] = {}  # deepcopy's: id -> the object that stands for it in the copy
    for param in module.parameters():
        if id(param) not in shared:
            memo[id(param)] = param
    for sub in module.modules():  # keep the unshared parts as they are: only the shared parameters are copied
        if not any(id(p) in shared for p in sub.parameters()):
            memo[id(sub)] = sub
    return copy.deepcopy(module, memo)


def _on_meta(modules: dict[int, nn.Module]) -> bool:
    return any(t.is_meta for m in modules.values() for t in [*m.parameters(), *m.buffers()])


def _hf_init(model: PreTrainedModel) -> Callable[[nn.Module], None]:
    def init(module: nn.Module) -> None:
        model._init_weights(module)

    return init


def _reset_parameters(module: nn.Module) -> None:
    reset = getattr(module, "reset_parameters", None)
    if callable(reset):
        reset()
