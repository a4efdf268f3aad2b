"""A model file for ``pipeforge profile --per-layer`` (docs/profile.md): a layer list whose head is heavy."""

import torch
from torch import nn

WIDTH, LAYERS, VOCAB = 64, 4, 512


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(WIDTH, WIDTH)

    def forward(self, x):
        return torch.tanh(self.linear(x))


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Linear(8, WIDTH)
        self.layers = nn.ModuleList(Block() for _ in range(LAYERS))
        self.head = nn.Linear(WIDTH, VOCAB)

    def forward(self, x):
        x = self.embed(x)
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


def pipeforge_layers() -> dict:
    torch.manual_seed(0)
    return {"model": Model(), "batch": torch.randn(16, 8)}
