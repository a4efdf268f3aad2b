"""Hugging Face causal LMs cut into stage modules, driven by the model's own metadata.

``parts_of(model)`` -> ``Parts`` (embedding, layers, norm, head and the pieces the base model's
``forward`` computes once) from ``base_model_prefix``, ``config.base_model_pp_plan`` and the input and
output embeddings; anything else in the base model refuses the cut, naming it. ``CausalLMStage``: one
stage, ``forward(x, attention_mask=None, position_ids=None)``, recomputing positions, the rotary and
each layer's mask by its global index, the cache off; it returns hidden states (logits on the last
stage), and an MoE stage its load-balancing loss through ``runtime.WithAuxLoss``. ``docs/models.md``.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeGuard

import torch
from torch import nn

from pipeforge.errors import UsageError

if TYPE_CHECKING:
    from transformers import PreTrainedConfig, PreTrainedModel


def is_causal_lm(model: nn.Module) -> TypeGuard[PreTrainedModel]:
    """Whether ``model`` is a Hugging Face causal LM: duck-typed, by the members of a ``PreTrainedModel`` that
    ``parts_of`` reads (so the type checker takes it for one)."""
    return hasattr(model, "config") and hasattr(model, "base_model_prefix") and hasattr(model, "get_output_embeddings")


@dataclass
class Parts:
    """The pieces of a causal LM that the stages hold, each with the name it has in the model."""

    config: PreTrainedConfig
    embed: nn.Module
    position: nn.Module | None  # an absolute position embedding (GPT-2's wpe)
    dropout: nn.Module | None
    rotary: nn.Module | None
    layers: Sequence[nn.Module]
    norm: nn.Module | None
    head: nn.Module
    names: dict[str, str]  # part ("embed", "layers.3", "head") -> its name in the model
    router: tuple[type, int] | None  # the module class whose output holds router logits, and the index
    balancing: Callable[..., torch.Tensor] | None  # the family's load_balancing_loss_func (None: it has none)


def parts_of(model: PreTrainedModel) -> Parts:
    """The model's parts (errors name what the cut does not know)."""
    prefix = model.base_model_prefix
    base = getattr(model, prefix, None)
    if base is None:
        raise UsageError(f"{type(model).__name__}: no base model at {prefix!r} (its base_model_prefix)")
    config = model.config
    plan = getattr(config, "base_model_pp_plan", None) or {}
    embed = model.get_input_embeddings()
    layers_name = next((name for name in plan if isinstance(getattr(base, name, None), nn.ModuleList)), None)
    if layers_name is None:
        lists = [name for name, child in base.named_children() if isinstance(child, nn.ModuleList)]
        if len(lists) != 1:
            raise UsageError(f"{type(model).__name__}: cannot tell its layer list (module lists {lists}); "
                             "give the model as an nn.Sequential or a module with one list of layers")
        layers_name = lists[0]
    children = dict(base.named_children())
    order = list(children)
    after = order[order.index(layers_name) + 1:]
    norm_name = "norm" if "norm" in plan and "norm" in children else next(
        (name for name in after if "norm" in type(children[name]).__name__.lower()), None)
    head = model.get_output_embeddings()
    if head is None:
        raise UsageError(f"{type(model).__name__} has no output embeddings (get_output_embeddings() is None): "
                         "not a causal LM")
    names = {"embed": f"{prefix}.{_name_in(base, embed)}", "head": _name_in(model, head)}
    found = {"position": None, "dropout": None, "rotary": None}
    for name, child in children.items():
        if child is embed or name in (layers_name, norm_name):
            continue
        kind = _kind(child, name, order.index(name) < order.index(layers_name))
        if kind is None:
            raise UsageError(f"{type(model).__name__}: its base model holds {name!r} ({type(child).__name__}), "
                             "which pipeforge.split does not know how to place in a stage")
        found[kind] = child
        names[kind] = f"{prefix}.{name}"
    layers = getattr(base, layers_name)[: getattr(config, "num_hidden_layers", len(getattr(base, layers_name)))]
    names.update({f"layers.{i}": f"{prefix}.{layers_name}.{i}" for i in range(len(layers))})
    if norm_name:
        names["norm"] = f"{prefix}.{norm_name}"
    return Parts(config, embed, found["position"], found["dropout"], found["rotary"], layers,
                 children.get(norm_name), head, names, _router(model), _balancing(model))


def _name_in(root: nn.Module, module: nn.Module) -> str:
    return next(name for name, child in root.named_modules() if child is module)


def _kind(child: nn.Module, name: str, before_layers: bool) -> str | None:
    if "Rotary" in type(child).__name__:
        return "rotary"
    if before_layers and isinstance(child, nn.Embedding):
        return "position"
    if before_layers and isinstance(child, nn.Dropout):
        return "dropout"
    return None


def _router(model: nn.Module) -> tuple[type, int] | None:
    recorder = (getattr(model, "_can_record_outputs", None) or {}).get("router_logits")
    target = getattr(recorder, "target_class", None)
    return (target, getattr(recorder, "index", 0)) if target is not None else None


def _balancing(model: nn.Module):
    return getattr(sys.modules.get(type(model).__module__), "load_balancing_loss_func", None)


def attention_type(config, layer: int) -> str:
    """The attention type of global layer ``layer``, as the model's ``forward`` picks its mask."""
    types = getattr(config, "layer_types", None)
    if types:
        return types[layer]
    return "sliding_attention" if getattr(config, "sliding_window", None) is not None else "full_attention"


def mask_function(kind: str):
    from transformers.masking_utils import LAYER_PATTERN_TO_MASK_FUNCTION_MAPPING

    function = LAYER_PATTERN_TO_MASK_FUNCTION_MAPPING.get(kind)
    if not callable(function):
        raise UsageError(f"attention type {kind!r}: pipeforge.split knows no single mask function for it")
    return function


class CausalLMStage(nn.Module):
    """Layers ``[first_layer, last_layer)`` of a causal LM; stage 0 also embeds, the last stage also predicts.

    ``forward(x, attention_mask=None, position_ids=None)``: ``x`` is the token ids on stage 0, the hidden
    states elsewhere; ``attention_mask`` (batch, sequence; 1 for a token, 0 for padding) and
    ``position_ids`` are the model's own, given to every stage (``shared_kwargs``)."""

    def __init__(self, parts: Parts, first_layer: int, last_layer: int, first: bool, last: bool,
                 aux_loss: bool = False):
        super().__init__()
        self.config = parts.config
        self.first_layer = first_layer
        self.embed = parts.embed if first else None
        self.position = parts.position if first else None
        self.dropout = parts.dropout if first else None
        self.rotary = parts.rotary
        self.layers = nn.ModuleDict({str(i): parts.layers[i] for i in range(first_layer, last_layer)})
        self.norm = parts.norm if last else None
        self.head = parts.head if last else None
        self.kinds = [attention_type(parts.config, i) for i in range(first_layer, last_layer)]
        for kind in set(self.kinds):
            mask_function(kind)  # refused now, not at the first step
        # a family without load_balancing_loss_func (DeepSeek-V3's loss-free balancing) adds no loss of its own
        self._router = parts.router if aux_loss and parts.balancing is not None else None
        self._balancing = parts.balancing

    def forward(self, x: torch.Tensor, attention_mask: torch.Tensor | None = None,
                position_ids: torch.Tensor | None = None):
        hidden = self.embed(x) if self.embed is not None else x
        if position_ids is None:
            position_ids = torch.arange(hidden.shape[1], device=hidden.device).unsqueeze(0)
        if self.position is not None:
            hidden = hidden + self.position(position_ids).to(hidden.device)
        if self.dropout is not None:
            hidden = self.dropout(hidden)
        if attention_mask is not None and attention_mask.ndim < 4:
            attention_mask = attention_mask.view(hidden.shape[0], -1)
        masks = {kind: mask_function(kind)(config=self.config, inputs_embeds=hidden, attention_mask=attention_mask,
                                           past_key_values=None, position_ids=position_ids)
                 for kind in dict.fromkeys(self.kinds)}
        extra = {}
        if self.rotary is not None:
            extra["position_embeddings"] = self.rotary(hidden, position_ids=position_ids)
        handles = self._record_router_logits()
        try:
            for kind, layer in zip(self.kinds, self.layers.values()):
                hidden = layer(hidden, attention_mask=masks[kind], position_ids=position_ids,
                               past_key_values=None, use_cache=False, **extra)
        finally:
            for handle in handles:
                handle.remove()
        if self.norm is not None:
            hidden = self.norm(hidden)
        if self.head is not None:
            hidden = self.head(hidden)
        if self._router is None or not self.training:
            return hidden
        from pipeforge.runtime.aux import WithAuxLoss

        return WithAuxLoss(hidden, self.balancing_loss(self._logits, attention_mask))

    def _record_router_logits(self) -> list:
        self._logits: list[torch.Tensor] = []
        if self._router is None or not self.training:
            return []
        kind, index = self._router

        def record(module, args, output):
            self._logits.append(output[index] if isinstance(output, tuple) else output)

        return [m.register_forward_hook(record) for m in self.layers.modules() if isinstance(m, kind)]

    def balancing_loss(self, logits: list, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """``config.router_aux_loss_coef`` times the sum over this stage's layers of each layer's load-balancing
        loss (the family's own ``load_balancing_loss_func`` on one layer's router logits)."""
        config, balancing = self.config, self._balancing
        assert balancing is not None, "a stage records router logits only where its family has the loss (__init__)"
        experts = getattr(config, "num_local_experts", None) or config.num_experts
        total = sum(balancing((layer,), experts, config.num_experts_per_tok, attention_mask)
                    for layer in logits)
        return config.router_aux_loss_coef * total
