"""A GPT with deliberately unequal stages, as a ``pipeforge profile`` model file (docs/profile.md).

Every stage holds ``BLOCKS_PER_STAGE`` transformer blocks, or as many as
``GPT_BLOCKS`` says (an environment variable: a comma-separated count per stage,
``1,3`` for 1 block on stage 0 and 3 on stage 1; the ranks inherit it); stage 0
also holds the embedding, made as heavy as two blocks (token embedding, then an
MLP of width 12 * WIDTH: about 48 WIDTH^2 flops a token, as two blocks' matmuls),
and the last stage the LM head, as heavy as two blocks (vocabulary 24 * WIDTH,
then the cross-entropy). So with 2 blocks a stage the stages cost about
4 : 2 : ... : 2 : 4, which on 2 stages is 4 : 4; ``GPT_BLOCKS=1,3`` makes
2 stages 3 : 5. ``pipeforge_layers()`` is the same GPT whole, for ``pipeforge
profile --per-layer`` and ``pipeforge.split`` (``PLAN_LAYERS`` blocks, default 8).
"""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F
from torch import nn

WIDTH, HEADS, SEQ = 256, 4, 64
VOCAB = 24 * WIDTH
BLOCKS_PER_STAGE = 2
ROWS = 16  # sequences per step


def blocks_per_stage(stages: int) -> list[int]:
    """How many blocks each stage holds: ``GPT_BLOCKS`` where set, else ``BLOCKS_PER_STAGE`` each."""
    given = os.environ.get("GPT_BLOCKS")
    if not given:
        return [BLOCKS_PER_STAGE] * stages
    counts = [int(n) for n in given.split(",")]
    if len(counts) != stages or min(counts) < 0:
        raise ValueError(f"GPT_BLOCKS={given!r}: expected {stages} counts of blocks, none negative")
    return counts


class Stage(nn.Module):
    def __init__(self, first: bool, last: bool, blocks: int = BLOCKS_PER_STAGE):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH) if first else None
        self.mix = nn.Sequential(nn.Linear(WIDTH, 12 * WIDTH), nn.GELU(), nn.Linear(12 * WIDTH, WIDTH)) if first else None
        self.blocks = nn.ModuleList(
            nn.TransformerEncoderLayer(WIDTH, HEADS, 4 * WIDTH, dropout=0.0, batch_first=True, norm_first=True)
            for _ in range(blocks))
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
    modules = [Stage(s == 0, s == stages - 1, n) for s, n in enumerate(blocks_per_stage(stages))]
    tokens = torch.randint(0, VOCAB, (ROWS, SEQ + 1))
    return {"modules": modules, "batch": tokens[:, :-1], "target": tokens[:, 1:], "loss_fn": loss_fn}


class Embed(nn.Module):
    """The token embedding and its MLP (about two blocks' matmuls): stage 0's extra weight."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.mix = nn.Sequential(nn.Linear(WIDTH, 12 * WIDTH), nn.GELU(), nn.Linear(12 * WIDTH, WIDTH))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        return x + self.mix(x)


class Block(nn.Module):
    """One causal transformer block, as ``Stage`` runs it."""

    def __init__(self):
        super().__init__()
        self.block = nn.TransformerEncoderLayer(WIDTH, HEADS, 4 * WIDTH, dropout=0.0, batch_first=True,
                                                norm_first=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mask = nn.Transformer.generate_square_subsequent_mask(x.size(1), dtype=x.dtype)
        return self.block(x, src_mask=mask, is_causal=True)


class Head(nn.Module):
    """The final norm and the LM head (vocabulary 24 * WIDTH): the last stage's extra weight."""

    def __init__(self):
        super().__init__()
        self.norm = nn.LayerNorm(WIDTH)
        self.head = nn.Linear(WIDTH, VOCAB, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.norm(x))


class GPT(nn.Module):
    """The whole model as a layer list (embedding, blocks, head), which ``pipeforge.split`` cuts anywhere."""

    def __init__(self, blocks: int):
        super().__init__()
        self.embed = Embed()
        self.blocks = nn.ModuleList(Block() for _ in range(blocks))
        self.head = Head()

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def pipeforge_layers() -> dict:
    """The whole GPT, its batch, target and loss (``pipeforge profile --per-layer``, the loop's plan arm)."""
    torch.manual_seed(0)
    tokens = torch.randint(0, VOCAB, (ROWS, SEQ + 1))
    return {"model": GPT(int(os.environ.get("PLAN_LAYERS", "8"))), "batch": tokens[:, :-1], "target": tokens[:, 1:],
            "loss_fn": loss_fn}
