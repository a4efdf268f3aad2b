"""A GPT with deliberately unequal stages, as a ``pipeforge profile`` model file (docs/profile.md).

Every stage holds ``BLOCKS_PER_STAGE`` transformer blocks; stage 0 also holds the
embedding, made as heavy as two blocks (token embedding, then an MLP of width
12 * WIDTH: about 48 WIDTH^2 flops a token, as two blocks' matmuls), and the
last stage the LM head, as heavy as two blocks (vocabulary 24 * WIDTH, then the
cross-entropy). So with 2 blocks a stage the stages cost about 4 : 2 : ... : 2 : 4.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

WIDTH, HEADS, SEQ = 256, 4, 64
VOCAB = 24 * WIDTH
BLOCKS_PER_STAGE = 2
ROWS = 16  # sequences per step


class Stage(nn.Module):
    def __init__(self, first: bool, last: bool):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH) if first else None
        self.mix = nn.Sequential(nn.Linear(WIDTH, 12 * WIDTH), nn.GELU(), nn.Linear(12 * WIDTH, WIDTH)) if first else None
        self.blocks = nn.ModuleList(
            nn.TransformerEncoderLayer(WIDTH, HEADS, 4 * WIDTH, dropout=0.0, batch_first=True, norm_first=True)
            for _ in range(BLOCKS_PER_STAGE))
        self.norm = nn.LayerNorm(WIDTH) if last else None
        self.head = nn.Linear(WIDTH, VOCAB, bias=False) if last else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.embed is not None:
            x = self.embed(x)
            x = x + self.mix(x)
        mask = nn.Transformer.generate_square_subsequent_mask(x.size(1), dtype=x.dtype)
        for block in self.blocks:
            x = block(x, src_mask=mask, is_causal=True)
        if self.head is not None:
            x = self.head(self.norm(x))
        return x


def loss_fn(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.reshape(-1, VOCAB), target.reshape(-1))


def pipeforge_model(stages: int) -> dict:
    torch.manual_seed(0)
    modules = [Stage(s == 0, s == stages - 1) for s in range(stages)]
    tokens = torch.randint(0, VOCAB, (ROWS, SEQ + 1))
    return {"modules": modules, "batch": tokens[:, :-1], "target": tokens[:, 1:], "loss_fn": loss_fn}
