"""A model file for ``pipeforge profile`` (the protocol of docs/profile.md): stage 0 is four times as wide."""

import torch
from torch import nn


def pipeforge_model(stages: int) -> dict:
    torch.manual_seed(0)
    widths = [256] + [64] * stages
    modules = [nn.Sequential(nn.Linear(widths[s], widths[s + 1]), nn.Tanh()) for s in range(stages)]
    return {"modules": modules, "batch": torch.randn(32, widths[0]), "target": torch.randn(32, widths[-1]),
            "loss_fn": lambda out, target: ((out - target) ** 2).mean()}
