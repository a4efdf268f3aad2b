"""The small GPT of ``examples/train_gpt.py`` and ``benchmarks/runtime/gpt.py``, cut into pipeline stages.

``nn.Embedding`` for tokens and positions, ``layers`` pre-norm causal
``nn.TransformerEncoderLayer`` blocks, a ``LayerNorm`` and a linear LM head, in
float32. ``gpt_stages(config, stages, seed)`` spreads the blocks over ``stages``
contiguous pieces (stage 0 also embeds, the last stage also predicts): the same
seed gives the same weights on every rank. ``token_batches`` yields windows of
one fixed random sequence, which the model learns to continue.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class GPTConfig:
    vocab: int = 128
    seq: int = 32
    width: int = 64
    heads: int = 4
    layers: int = 8


class GPTStage(nn.Module):
    """Layers ``[first_layer, last_layer)`` of the GPT; stage 0 also embeds, the last stage also predicts."""

    def __init__(self, config: GPTConfig, first_layer: int, last_layer: int, first: bool, last: bool):
        super().__init__()
        self.config = config
        self.embed = nn.Embedding(config.vocab, config.width) if first else None
        self.position = nn.Embedding(config.seq, config.width) if first else None
        self.blocks = nn.ModuleList(
            nn.TransformerEncoderLayer(config.width, config.heads, 4 * config.width, dropout=0.0,
                                       batch_first=True, norm_first=True)
            for _ in range(first_layer, last_layer))
        self.norm = nn.LayerNorm(config.width) if last else None
        self.head = nn.Linear(config.width, config.vocab, bias=False) if last else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.embed is not None:  # token ids in, hidden states out
            x = self.embed(x) + self.position(torch.arange(x.size(1), device=x.device))
        mask = nn.Transformer.generate_square_subsequent_mask(x.size(1), device=x.device, dtype=x.dtype)
        for block in self.blocks:
            x = block(x, src_mask=mask, is_causal=True)
        if self.head is not None:
            x = self.head(self.norm(x))
        return x


def gpt_stages(config: GPTConfig, stages: int, seed: int = 0) -> list[GPTStage]:
    """The whole model as ``stages`` pieces, layers spread as evenly as possible (same seed, same weights)."""
    if stages > config.layers:
        raise ValueError(f"{stages} stages need at least as many layers (the model has {config.layers})")
    torch.manual_seed(seed)
    bounds = [round(s * config.layers / stages) for s in range(stages + 1)]
    return [GPTStage(config, bounds[s], bounds[s + 1], s == 0, s == stages - 1) for s in range(stages)]


def lm_loss(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), target.reshape(-1))


def token_batches(config: GPTConfig, rows: int, seed: int = 1) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Windows of one fixed random sequence: (tokens, the next tokens), forever."""
    generator = torch.Generator().manual_seed(seed)
    text = torch.randint(config.vocab, (4 * config.seq,), generator=generator)
    while True:
        starts = torch.randint(len(text) - config.seq - 1, (rows,), generator=generator)
        windows = torch.stack([text[s: s + config.seq + 1] for s in starts.tolist()])
        yield windows[:, :-1], windows[:, 1:]
