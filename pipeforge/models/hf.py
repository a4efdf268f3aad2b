"""Hugging Face causal LMs cut into stage modules, driven by the model's own metadata and structure.

``parts_of(model)`` -> ``Parts`` (embedding, layers, norm, head and the pieces the base model's
``forward`` computes once) from ``base_model_prefix``, ``config.base_model_pp_plan`` (its order is the
forward's), the input and output embeddings and the layers' signatures; anything else refuses the cut,
naming it. ``CausalLMStage``: one stage, ``forward(x, attention_mask=None, position_ids=None)``,
recomputing positions, the rotary (per attention type where it takes one), ALiBi and each layer's mask
by its global index, the cache off, the config's embedding and logit scales; it returns hidden states
(logits on the last stage), and an MoE stage its load-balancing loss through ``runtime.WithAuxLoss``.
``docs/models.md``.
"""

from __future__ import annotations

import inspect
import re
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeGuard

import torch
from torch import nn

from pipeforge.errors import UsageError

if TYPE_CHECKING:
    from transformers import PreTrainedConfig, PreTrainedModel


def _is_pretrained(module: nn.Module) -> bool:
    """Whether ``module`` is a Hugging Face pretrained model, causal LM or base (duck-typed: a config and a
    base_model_prefix)."""
    return hasattr(module, "config") and hasattr(module, "base_model_prefix")


def is_causal_lm(model: nn.Module) -> TypeGuard[PreTrainedModel]:
    """Whether ``model`` is a Hugging Face causal LM: duck-typed, by the members of a ``PreTrainedModel`` that
    ``parts_of`` reads (so the type checker takes it for one)."""
    return _is_pretrained(model) and hasattr(model, "get_output_embeddings")


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
    embed_norm: nn.Module | None = None  # a norm of the embeddings before the layers (BLOOM's)
    alibi: Callable[..., torch.Tensor] | None = None  # the family's build_alibi_tensor, where its layers take one
    arguments: tuple[frozenset[str], bool] = (frozenset(), True)  # what the layers take; whether any keyword
    prelude: tuple[str, ...] = ("position", "dropout", "embed_norm")  # stage 0's pieces in the forward's order
    float_logits: bool = False  # the forward makes the head's output float32 (Mamba's ``lm_head(...).float()``)


def parts_of(model: PreTrainedModel) -> Parts:
    """The model's parts (errors name what the cut does not know)."""
    _refuse_other_than_decoders(model)
    prefix, base = base_model(model)
    config = model.config
    plan = getattr(config, "base_model_pp_plan", None) or {}
    embed = model.get_input_embeddings()
    children = dict(base.named_children())
    layers_name = _layer_list(model, prefix, plan, children)
    order = [name for name in plan if name in children] + [name for name in children if name not in plan]
    before = order[: order.index(layers_name)]  # the forward's order where the plan gives it
    after = [name for name in order if name not in before and name != layers_name]
    norm_name = next((name for name in plan if name in after), None) or next(
        (name for name in after if "norm" in type(children[name]).__name__.lower()), None)
    head = model.get_output_embeddings()
    if head is None:
        raise UsageError(f"{type(model).__name__} has no output embeddings (get_output_embeddings() is None): "
                         "not a causal LM")
    names = {"embed": f"{prefix}.{_name_in(base, embed)}", "head": _name_in(model, head)}
    found: dict[str, nn.Module | None] = {"position": None, "dropout": None, "rotary": None, "embed_norm": None}
    for name in order:
        child = children[name]
        if child is embed or name in (layers_name, norm_name):
            continue
        kind = _kind(child, name in before)
        if kind is None or found[kind] is not None:
            raise UsageError(f"{type(model).__name__}: its base model holds {name!r} ({type(child).__name__}), "
                             "which pipeforge.split does not know how to place in a stage")
        found[kind] = child
        names[kind] = f"{prefix}.{name}"
    layers = getattr(base, layers_name)[: getattr(config, "num_hidden_layers", len(getattr(base, layers_name)))]
    names.update({f"layers.{i}": f"{prefix}.{layers_name}.{i}" for i in range(len(layers))})
    if norm_name:
        names["norm"] = f"{prefix}.{norm_name}"
    return Parts(config, embed, found["position"], found["dropout"], found["rotary"], layers,
                 children[norm_name] if norm_name else None, head, names, _router(model), _balancing(model),
                 embed_norm=found["embed_norm"], alibi=_alibi(model, layers),
                 arguments=_layer_arguments(model, layers[0]) if len(layers) else (frozenset(), True),
                 prelude=tuple(kind for kind in names if kind in ("position", "dropout", "embed_norm")),
                 float_logits=_casts_logits_to_float(model))


_FLOAT_LOGITS = re.compile(r"=\s*self\.lm_head\(.*\)\.float\(\)\s*$", re.MULTILINE)


def _casts_logits_to_float(model: nn.Module) -> bool:
    """Whether the causal LM's ``forward`` makes float32 logits of its head's output (``logits =
    self.lm_head(...).float()``: Mamba, Falcon-Mamba, Mamba-2, Nemotron-H, xLSTM), read from its source; the cut
    does the same, or a float64 or bfloat16 model's logits would differ from the forward's (the loss computed in
    the model's dtype instead of float32)."""
    try:
        source = inspect.getsource(type(model).forward)
    except (OSError, TypeError):  # no source to read (a frozen install): the head's dtype, as most families
        return False
    return _FLOAT_LOGITS.search(source) is not None


def base_model(model: PreTrainedModel) -> tuple[str, nn.Module]:
    """The name and module of the model's base: at its ``base_model_prefix``, else its one child that is a
    pretrained model besides the head (Llama 4's text LM: prefix ``language_model``, its base at ``model``)."""
    prefix = model.base_model_prefix
    base = getattr(model, prefix, None)
    if isinstance(base, nn.Module):
        return prefix, base
    head = model.get_output_embeddings()
    found = [(name, child) for name, child in model.named_children()
             if child is not head and _is_pretrained(child)]
    if len(found) == 1:
        return found[0]
    held = ", ".join(repr(name) for name, _ in found) or "none"
    raise UsageError(f"{type(model).__name__}: no base model at {prefix!r} (its base_model_prefix), and not one "
                     f"pretrained model among its children to take for it ({held})")


def _refuse_other_than_decoders(model: nn.Module) -> None:
    """An encoder (BERT's masked LM) or an encoder-decoder (T5) is not a decoder-only causal LM."""
    config = model.config
    if getattr(config, "is_encoder_decoder", False):
        raise UsageError(f"{type(model).__name__} is an encoder-decoder model (config.is_encoder_decoder): "
                         "pipeforge.split cuts decoder-only causal LMs")
    can_generate = getattr(model, "can_generate", None)
    if callable(can_generate) and not can_generate() and not type(model).__name__.endswith("ForCausalLM"):
        raise UsageError(f"{type(model).__name__} is not a causal LM (it cannot generate: an encoder or a task "
                         "head): pipeforge.split cuts decoder-only causal LMs")
    if getattr(config, "use_bidirectional_attention", False):
        raise UsageError(f"{type(model).__name__} attends both ways (config.use_bidirectional_attention): "
                         "pipeforge.split makes causal masks")
    both_ways = next((name for name, module in model.named_modules() if getattr(module, "is_causal", None) is False),
                     None)
    if both_ways is not None:
        raise UsageError(f"{type(model).__name__}: its attention {both_ways!r} is not causal (is_causal=False: an "
                         "encoder, or cross-attention): pipeforge.split cuts decoder-only causal LMs")


def _layer_list(model: nn.Module, prefix: str, plan, children: dict[str, nn.Module]) -> str:
    name = next((name for name in plan if isinstance(children.get(name), nn.ModuleList)), None)
    if name is not None:
        return name
    lists = [name for name, child in children.items() if isinstance(child, nn.ModuleList)]
    if len(lists) == 1:
        return lists[0]
    held = ", ".join(f"{name} ({type(child).__name__})" for name, child in children.items())
    raise UsageError(f"{type(model).__name__}: cannot tell its layer list: its base model {prefix!r} holds "
                     f"{len(lists)} nn.ModuleList children ({held}), where pipeforge.split needs exactly one "
                     "(or one named by config.base_model_pp_plan); give the model as an nn.Sequential or a "
                     "module with one list of layers")


def _name_in(root: nn.Module, module: nn.Module) -> str:
    return next(name for name, child in root.named_modules() if child is module)


def _kind(child: nn.Module, before_layers: bool) -> str | None:
    if "Rotary" in type(child).__name__:
        return "rotary"
    if not before_layers:
        return None
    if isinstance(child, nn.Embedding):
        return "position"
    if isinstance(child, nn.Dropout):
        return "dropout"
    if "norm" in type(child).__name__.lower():
        return "embed_norm"
    return None


def _alibi(model: nn.Module, layers: Sequence[nn.Module]):
    """The family's ``build_alibi_tensor`` where its layers take ``alibi`` (None: they do not, or are given
    None); a model whose forward folds ALiBi into the mask (Falcon's ``config.alibi``) is refused."""
    if not layers or "alibi" not in inspect.signature(layers[0].forward).parameters:
        return None
    if getattr(model.config, "alibi", None) is False:
        return None  # Falcon with rotary: its layers take alibi=None
    if getattr(model.config, "alibi", None) is True:
        raise UsageError(f"{type(model).__name__}: its forward folds ALiBi into the attention mask "
                         "(config.alibi=True), which pipeforge.split does not compute")
    build = getattr(sys.modules.get(type(model).__module__), "build_alibi_tensor", None)
    if not callable(build):
        raise UsageError(f"{type(model).__name__}: its layers take ALiBi biases ('alibi') and its module has no "
                         "build_alibi_tensor for pipeforge.split to make them with")
    return build


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
    """transformers' mask function for the mask kind ``kind`` (``full_attention``, ``linear_attention``, ...)."""
    from transformers.masking_utils import LAYER_PATTERN_TO_MASK_FUNCTION_MAPPING

    return LAYER_PATTERN_TO_MASK_FUNCTION_MAPPING[kind]


def layer_masks(kind: str, layer: nn.Module, where: str = "a layer") -> dict[str, str]:
    """Which mask kind each mask argument of a layer of type ``kind`` gets, as the model's ``forward`` gives them:
    ``attention_mask`` the type's own; none for a type transformers maps to no mask (Nemotron-H's ``moe`` and
    ``mlp`` blocks, given ``mapping.get(block_type)``); for a type mapped to an attention mask and
    ``linear_attention`` (Falcon-H1's ``hybrid``), ``attention_mask`` the attention's and the layer's one other
    ``..._attention_mask`` argument the recurrent one. Any other layer is refused, ``where`` naming it."""
    from transformers.masking_utils import LAYER_PATTERN_TO_MASK_FUNCTION_MAPPING

    function = LAYER_PATTERN_TO_MASK_FUNCTION_MAPPING.get(kind)
    if function is None:
        return {}
    if callable(function):
        return {"attention_mask": kind}
    assert isinstance(function, dict), f"transformers maps {kind!r} to a function or a dict of them"
    names = [name for name in inspect.signature(layer.forward).parameters if name.endswith("attention_mask")]
    others = [name for name in names if name != "attention_mask"]
    attention = [k for k in function if k != "linear_attention"]
    if "attention_mask" in names and len(others) == 1 and "linear_attention" in function and len(attention) == 1 \
            and callable(LAYER_PATTERN_TO_MASK_FUNCTION_MAPPING.get(attention[0])):
        return {"attention_mask": attention[0], others[0]: "linear_attention"}
    raise UsageError(f"{where}: attention type {kind!r} names no single mask function of transformers' "
                     f"masking_utils (it maps to several: {', '.join(map(repr, function))}) and its layer does not "
                     "take one attention_mask and one other ..._attention_mask for them; pipeforge.split cannot cut it")


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
        self.embed_norm = parts.embed_norm if first else None
        self.rotary = parts.rotary
        self.layers = nn.ModuleDict({str(i): parts.layers[i] for i in range(first_layer, last_layer)})
        self.norm = parts.norm if last else None
        self.head = parts.head if last else None
        self.kinds = [attention_type(parts.config, i) for i in range(first_layer, last_layer)]
        self.masks = [layer_masks(kind, self.layers[str(index)],  # refused now, not at the first step
                                  f"{type(self.layers[str(index)]).__name__} {parts.names[f'layers.{index}']!r}")
                      for index, kind in enumerate(self.kinds, first_layer)]
        self._alibi = parts.alibi
        self._arguments = parts.arguments
        self._order = parts.prelude
        self._float_logits = parts.float_logits
        self._rotary_by_type = self.rotary is not None and "layer_type" in inspect.signature(
            self.rotary.forward).parameters
        # a family without load_balancing_loss_func (DeepSeek-V3's loss-free balancing) adds no loss of its own
        # and a stage none of whose layers routes (Jamba's stage of Mamba layers only) none either
        routes = parts.router is not None and any(isinstance(m, parts.router[0]) for m in self.layers.modules())
        self._router = parts.router if aux_loss and parts.balancing is not None and routes else None
        self._balancing = parts.balancing

    def forward(self, x: torch.Tensor, attention_mask: torch.Tensor | None = None,
                position_ids: torch.Tensor | None = None):
        hidden = embedded(self.config, self.embed(x)) if self.embed is not None else x
        if position_ids is None:
            position_ids = torch.arange(hidden.shape[1], device=hidden.device).unsqueeze(0)
        hidden = self._prelude(hidden, position_ids)
        if attention_mask is not None and attention_mask.ndim < 4:
            attention_mask = attention_mask.view(hidden.shape[0], -1)
        masks = {kind: mask_function(kind)(config=self.config, inputs_embeds=hidden, attention_mask=attention_mask,
                                           past_key_values=None, position_ids=position_ids)
                 for kind in dict.fromkeys(k for given in self.masks for k in given.values())}
        extra = self._shared_arguments(hidden, attention_mask, position_ids)
        rotary = self._rotary(hidden, position_ids)
        handles = self._record_router_logits()
        try:
            for kind, given, layer in zip(self.kinds, self.masks, self.layers.values()):
                arguments = {"attention_mask": None, "position_ids": position_ids, "past_key_values": None,
                             "use_cache": False, **extra, **{name: masks[k] for name, k in given.items()}}
                if rotary is not None:
                    arguments["position_embeddings"] = rotary[kind]
                output = layer(hidden, **self._accepted(arguments))
                hidden = output[0] if isinstance(output, tuple) else output  # older families return (hidden, ...)
        finally:
            for handle in handles:
                handle.remove()
        if self.norm is not None:
            hidden = self.norm(hidden)
        if self.head is not None:
            logits = self.head(hidden)
            hidden = final_logits(self.config, logits.float() if self._float_logits else logits)
        if self._router is None or not self.training:
            return hidden
        from pipeforge.runtime.aux import WithAuxLoss

        return WithAuxLoss(hidden, self.balancing_loss(self._logits, attention_mask))

    def _prelude(self, hidden: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
        """Stage 0's position embedding (added), embedding dropout and embedding norm, in the forward's order."""
        for kind in self._order:
            piece = getattr(self, kind)
            if piece is None:
                continue
            hidden = hidden + piece(position_ids).to(hidden.device) if kind == "position" else piece(hidden)
        return hidden

    def _rotary(self, hidden: torch.Tensor, position_ids: torch.Tensor) -> dict | None:
        """Each attention type's (cos, sin): one table, or one per type where the rotary takes ``layer_type``."""
        if self.rotary is None:
            return None
        if self._rotary_by_type:
            return {kind: self.rotary(hidden, position_ids, kind) for kind in dict.fromkeys(self.kinds)}
        table = self.rotary(hidden, position_ids=position_ids)
        return {kind: table for kind in self.kinds}

    def _shared_arguments(self, hidden: torch.Tensor, attention_mask: torch.Tensor | None,
                          position_ids: torch.Tensor) -> dict:
        if "alibi" not in self._arguments[0]:
            return {}
        if self._alibi is None:
            return {"alibi": None}
        mask = attention_mask if attention_mask is not None and attention_mask.ndim == 2 else torch.ones(
            hidden.shape[:2], dtype=torch.long, device=hidden.device)
        return {"alibi": self._alibi(mask, self.config.num_attention_heads, dtype=hidden.dtype)}

    def _accepted(self, arguments: dict) -> dict:
        if self._arguments[1]:
            return arguments
        return {name: value for name, value in arguments.items() if name in self._arguments[0]}

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


# what a stage gives each layer: the mask, positions, rotary, ALiBi, and the cache off
GIVEN = frozenset({"attention_mask", "position_ids", "position_embeddings", "alibi", "past_key_values", "use_cache"})


def _layer_arguments(model: nn.Module, layer: nn.Module) -> tuple[frozenset[str], bool]:
    """The names a layer's ``forward`` takes and whether it takes any keyword; one that needs an argument the
    stage does not make (MPT's ``position_bias``) is refused, naming it."""
    parameters = list(inspect.signature(layer.forward).parameters.values())[1:]  # after the hidden states
    needed = [p.name for p in parameters if p.default is inspect.Parameter.empty
              and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and p.name not in GIVEN]
    if needed:
        raise UsageError(f"{type(model).__name__}: its layers' {type(layer).__name__}.forward needs {needed}, which "
                         "the model's forward computes and pipeforge.split does not know how to make")
    return frozenset(p.name for p in parameters), any(p.kind is p.VAR_KEYWORD for p in parameters)


def embedded(config, hidden: torch.Tensor) -> torch.Tensor:
    """The embeddings as the base model's ``forward`` scales them (Granite's ``config.embedding_multiplier``)."""
    multiplier = getattr(config, "embedding_multiplier", None)
    return hidden * multiplier if multiplier is not None else hidden


def final_logits(config, logits: torch.Tensor) -> torch.Tensor:
    """The head's output as the causal LM's ``forward`` turns it into logits, by the config's switches:
    Granite's ``logits_scaling`` (divides), Cohere's ``logit_scale`` (multiplies), Gemma 2 and 3's
    ``final_logit_softcapping`` (``tanh(logits / cap) * cap``)."""
    scaling = getattr(config, "logits_scaling", None)
    if scaling is not None:
        logits = logits / scaling
    scale = getattr(config, "logit_scale", None)
    if scale is not None:
        logits = logits * scale
    cap = getattr(config, "final_logit_softcapping", None)
    if cap is not None:
        logits = torch.tanh(logits / cap) * cap
    return logits
