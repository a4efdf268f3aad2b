"""The cut checked against the model: its stages chained on a tiny input give the model's own output.

``verify_cut(model, every)`` runs, when the whole model has values, a batch of
short sequences (a Hugging Face model's second row padded, its attention mask
given to every stage) through ``model`` and through every stage in order (eval
mode, no gradients, the random state and every module's mode restored) and
raises a ``UsageError`` when the two differ in a single bit: a model whose
``forward`` computes something the cut does not (a subclass that rescales the
logits or drops the mask, a layer-list model that adds positions in its
``forward``) is refused instead of training silently wrong.
Plain models are checked when their first module says what it takes
(``nn.Embedding``: token ids; ``nn.Linear``: features); others are not. A
model still on the meta device cannot be run: ``warn_unchecked`` warns when its
family is not one the cut was tested on.
"""

from __future__ import annotations

import warnings

import torch
from torch import nn

from pipeforge.errors import UsageError
from pipeforge.models import hf


def verify_cut(model: nn.Module, every: dict[int, nn.Module]) -> None:
    example = _example(model)
    if example is None:
        return
    modes = [(m, m.training) for m in model.modules()] + [(m, m.training) for s in every.values() for m in s.modules()]
    try:
        with torch.random.fork_rng(devices=[example.device] if example.device.type == "cuda" else []), \
                torch.no_grad():
            model.eval()
            for stage in every.values():
                stage.eval()
            mask = _padding_mask(example) if hf.is_causal_lm(model) else None
            want = _own_output(model, example, mask)
            got = example
            for index in sorted(every):
                got = every[index](got) if mask is None else every[index](got, attention_mask=mask)
    finally:
        for module, training in modes:
            module.training = training
    if not isinstance(got, torch.Tensor) or got.shape != want.shape or not torch.equal(got, want):
        difference = (got - want).abs().max().item() if isinstance(got, torch.Tensor) and got.shape == want.shape \
            else "another shape"
        raise UsageError(f"pipeforge.split: the stages cut from {type(model).__name__} do not compute what its "
                         f"forward computes (largest difference {difference} on a tiny input): its forward does "
                         "something beyond its embedding, layers, norm and head that the cut does not know; "
                         "pass verify=False to cut it anyway")


# Hugging Face model types whose cut equals the model bit for bit (tests/models: families.HF and WORLD; gemma by hand)
TESTED = frozenset({"llama", "gpt2", "qwen2", "mistral", "mixtral", "qwen2_moe", "qwen3", "gemma", "phi3", "olmo2",
                    "gemma2", "gemma3_text", "phi", "gpt_neox", "falcon", "qwen3_moe", "cohere", "stablelm",
                    "starcoder2", "gptj", "bloom", "granite", "granitemoe", "olmoe", "gpt_oss", "deepseek_v3", "jamba",
                    "lfm2", "llama4_text", "mamba", "falcon_mamba", "mamba2", "falcon_h1",
                    "nemotron_h"})


def warn_unchecked(model: nn.Module) -> None:
    kind = getattr(getattr(model, "config", None), "model_type", None)
    if hf.is_causal_lm(model) and kind not in TESTED:
        warnings.warn(f"pipeforge.split: {type(model).__name__} (model_type {kind!r}) is on the meta device, so the "
                      "cut cannot be checked against its forward, and its family is not among those tested; split "
                      "the whole model once where it fits (owned=None checks it) before training", stacklevel=3)


def _own_output(model: nn.Module, example: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    output: torch.Tensor = (model(input_ids=example, attention_mask=mask, use_cache=False).logits
                            if hf.is_causal_lm(model) else model(example))
    return output


def _padding_mask(example: torch.Tensor) -> torch.Tensor:
    """Every token but the last of the second row (right padding: each row still sees a token)."""
    mask = torch.ones_like(example)
    mask[1:, -1] = 0
    return mask


def _example(model: nn.Module) -> torch.Tensor | None:
    parameter = next(model.parameters(), None)
    if parameter is None:
        return None
    device = parameter.device
    generator = torch.Generator().manual_seed(0)
    if hf.is_causal_lm(model):
        vocab = getattr(model.config, "vocab_size", 2) or 2
        return torch.randint(0, min(vocab, 16), (2, 4), generator=generator).to(device)
    first = next((m for m in model.modules() if not list(m.children())), None)
    if isinstance(first, nn.Embedding):
        return torch.randint(0, min(first.num_embeddings, 16), (1, 4), generator=generator).to(device)
    if isinstance(first, nn.Linear):
        return torch.randn(1, first.in_features, generator=generator, dtype=first.weight.dtype).to(device)
    return None
