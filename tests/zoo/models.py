"""A small model zoo in float64, split into pipeline stages.

- ``gpt``: ``nn.Embedding`` (tokens and positions), ``nn.TransformerEncoderLayer``
  blocks (pre-norm, causal, a key padding mask given to every stage), a
  ``LayerNorm`` and a linear LM head;
- ``llama``: hand-written Llama blocks (RMSNorm, rotary embeddings on the
  positions given to every stage, ``F.scaled_dot_product_attention``, SwiGLU);
- ``moe``: blocks whose feed-forward is a top-2 mixture of experts (an expert
  no token was routed to gets no gradient in that microbatch);
- ``tied``: the GPT with its LM head tied to the token embedding (the same
  parameter in the unpipelined model; named in ``tied_parameters`` when the
  first and last stages live on different ranks);
- ``gpt-dropout`` and ``tied-dropout`` (not in ``MODELS``): the GPT and the tied
  GPT with dropout 0.3 in every block, compared under
  ``make_pipeline(rng_seed=...)`` (``tests/zoo/test_zoo_dropout.py``).

``build(model, stages, seed)`` returns the stage modules (stage 0 embeds, the
last stage ends with the head); ``batch(...)`` the tokens, the targets and the
per-stage inputs (``shared_kwargs``) for one step.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

MODELS = ("gpt", "llama", "moe", "tied")
VOCAB, WIDTH, HEADS, SEQ = 11, 8, 2, 4


class Embed(nn.Module):
    def __init__(self):
        super().__init__()
        self.tokens = nn.Embedding(VOCAB, WIDTH)
        self.positions = nn.Embedding(SEQ, WIDTH)

    def forward(self, tokens, **_):
        return self.tokens(tokens) + self.positions.weight[: tokens.size(1)]


class GptBlock(nn.Module):
    """``nn.TransformerEncoderLayer``, causal, with the key padding mask every stage receives."""

    def __init__(self, dropout: float = 0.0):
        super().__init__()
        self.layer = nn.TransformerEncoderLayer(WIDTH, HEADS, 2 * WIDTH, dropout=dropout, batch_first=True,
                                                norm_first=True)
        self.register_buffer("causal", torch.ones(SEQ, SEQ, dtype=torch.bool).triu(1), persistent=False)

    def forward(self, x, padding=None, **_):
        return self.layer(x, src_mask=self.causal, src_key_padding_mask=padding)


class Head(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = nn.LayerNorm(WIDTH)
        self.out = nn.Linear(WIDTH, VOCAB, bias=False)

    def forward(self, x, **_):
        return self.out(self.norm(x))


class RMSNorm(nn.Module):
    def __init__(self, width: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(width))
        self.eps = eps

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rotate(x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """Rotary embeddings: pairs of channels turned by an angle proportional to the position."""
    half = x.size(-1) // 2
    frequencies = 1.0 / (10000 ** (torch.arange(half, dtype=x.dtype) / half))
    angles = positions.to(x.dtype)[:, None, :, None] * frequencies  # batch, 1, sequence, half
    cos, sin = angles.cos(), angles.sin()
    a, b = x[..., :half], x[..., half:]
    return torch.cat([a * cos - b * sin, a * sin + b * cos], dim=-1)


class SwiGLU(nn.Module):
    def __init__(self, width: int, hidden: int):
        super().__init__()
        self.gate = nn.Linear(width, hidden, bias=False)
        self.up = nn.Linear(width, hidden, bias=False)
        self.down = nn.Linear(hidden, width, bias=False)

    def forward(self, x):
        return self.down(F.silu(self.gate(x)) * self.up(x))


class LlamaBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.attn_norm, self.mlp_norm = RMSNorm(WIDTH), RMSNorm(WIDTH)
        self.qkv = nn.Linear(WIDTH, 3 * WIDTH, bias=False)
        self.proj = nn.Linear(WIDTH, WIDTH, bias=False)
        self.mlp = SwiGLU(WIDTH, 2 * WIDTH)

    def forward(self, x, positions=None, **_):
        batch, seq, _ = x.shape
        positions = torch.arange(seq).expand(batch, seq) if positions is None else positions
        q, k, v = self.qkv(self.attn_norm(x)).view(batch, seq, 3, HEADS, WIDTH // HEADS).permute(2, 0, 3, 1, 4)
        q, k = rotate(q, positions), rotate(k, positions)
        attended = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(attended.transpose(1, 2).reshape(batch, seq, WIDTH))
        return x + self.mlp(self.mlp_norm(x))


class TopTwoMoE(nn.Module):
    """Each token goes to its two highest-scoring experts, weighted by their renormalized scores."""

    def __init__(self, experts: int = 4):
        super().__init__()
        self.router = nn.Linear(WIDTH, experts, bias=False)
        self.experts = nn.ModuleList(SwiGLU(WIDTH, WIDTH) for _ in range(experts))

    def forward(self, x):
        flat = x.reshape(-1, x.size(-1))
        scores, chosen = self.router(flat).softmax(-1).topk(2, dim=-1)
        scores = scores / scores.sum(-1, keepdim=True)
        out = torch.zeros_like(flat)
        for index, expert in enumerate(self.experts):
            rows, slot = (chosen == index).nonzero(as_tuple=True)
            if rows.numel() == 0:
                continue  # no token for this expert: it gets no gradient from this microbatch
            out = out.index_add(0, rows, expert(flat[rows]) * scores[rows, slot, None])
        return out.view_as(x)


class MoeBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = nn.LayerNorm(WIDTH)
        self.moe = TopTwoMoE()

    def forward(self, x, **_):
        return x + self.moe(self.norm(x))


class Stage(nn.Module):
    """A pipeline stage: optionally the embedding, some blocks, optionally the head."""

    def __init__(self, blocks: list[nn.Module], embed: nn.Module | None = None, head: nn.Module | None = None):
        super().__init__()
        self.embed, self.blocks, self.head = embed, nn.ModuleList(blocks), head

    def forward(self, x, **every_stage):
        if self.embed is not None:
            x = self.embed(x)
        for block in self.blocks:
            x = block(x, **every_stage)
        return self.head(x) if self.head is not None else x


DROPOUT = 0.3  # of the gpt-dropout model


def DropoutGptBlock() -> GptBlock:
    return GptBlock(DROPOUT)


BLOCKS = {"gpt": GptBlock, "llama": LlamaBlock, "moe": MoeBlock, "tied": GptBlock, "gpt-dropout": DropoutGptBlock,
          "tied-dropout": DropoutGptBlock}
TIED_MODELS = ("tied", "tied-dropout")


def build(model: str, stages: int, seed: int = 0) -> list[nn.Module]:
    """One block per stage; stage 0 also embeds and the last stage ends with the head."""
    torch.manual_seed(seed)
    built = [Stage([BLOCKS[model]()], Embed() if s == 0 else None, Head() if s == stages - 1 else None)
             for s in range(stages)]
    if model in TIED_MODELS:
        built[-1].head.out.weight = built[0].embed.tokens.weight
    return [stage.double() for stage in built]


TIED = [(0, "embed.tokens.weight"), (-1, "head.out.weight")]


def tied_parameters(model: str, stages: int) -> list[list[tuple[int, str]]]:
    if model not in TIED_MODELS:
        return []
    return [[(stage % stages, name) for stage, name in TIED]]


def batch(model: str, rows: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, dict]:
    """Tokens, next-token targets and the inputs every stage receives (padding mask or positions)."""
    generator = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, VOCAB, (rows, SEQ + 1), generator=generator)
    if model == "llama":
        offsets = torch.randint(0, 3, (rows, 1), generator=generator)
        every_stage = {"positions": offsets + torch.arange(SEQ)}
    elif model in ("gpt", "gpt-dropout", *TIED_MODELS):
        lengths = torch.randint(1, SEQ + 1, (rows, 1), generator=generator)
        every_stage = {"padding": torch.arange(SEQ) >= lengths}
    else:
        every_stage = {}
    return tokens[:, :-1], tokens[:, 1:], every_stage


def loss_fn(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), target.reshape(-1))


def parameter_count(stages: list[nn.Module]) -> int:
    return sum(math.prod(p.shape) for p in {id(p): p for s in stages for p in s.parameters()}.values())
