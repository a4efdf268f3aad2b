"""Spawned workers for tests/runtime/test_runtime_saved.py: dropout under recompute, and saved bytes."""

from __future__ import annotations

import torch
from torch import nn

from tests.zoo import models as zoo


class DropoutGpt(nn.Module):
    """The zoo's GPT block with dropout on (0.3), in training mode."""

    def __init__(self):
        super().__init__()
        self.layer = nn.TransformerEncoderLayer(zoo.WIDTH, zoo.HEADS, 2 * zoo.WIDTH, dropout=0.3, batch_first=True,
                                                norm_first=True)

    def forward(self, x, **_):
        return self.layer(x)


def build(stages: int) -> list[nn.Module]:
    torch.manual_seed(0)
    built = [zoo.Stage([DropoutGpt()], zoo.Embed() if s == 0 else None, zoo.Head() if s == stages - 1 else None)
             for s in range(stages)]
    return [stage.double().train() for stage in built]


def run(rank: int, nproc: int, paths: dict[str, str]) -> dict:
    """Per module (label -> path): the losses and every gradient of one step with dropout on, each run
    from the same RNG seed, and the rank's peak bytes of saved activations."""
    from pipeforge.tools.generated import load_module

    found = {}
    for label, path in paths.items():
        generated = load_module(path)
        info = generated.SCHEDULE
        modules = build(info.stages)
        mine = {s: modules[s] for s in info.stages_of(rank)}
        pipe = generated.make_pipeline(mine, loss_fn=zoo.loss_fn, timeout=30)
        pipe.count_saved = True
        tokens, targets, _ = zoo.batch("gpt", 2 * info.microbatches, 0)
        torch.manual_seed(1234 + rank)
        losses: list = []
        pipe.step(*((tokens,) if pipe.holds_first else ()), target=targets if pipe.holds_last else None,
                  losses=losses)
        grads = {f"{s}:{n}": p.grad.flatten().tolist() for s, m in mine.items() for n, p in m.named_parameters()
                 if p.grad is not None}
        found[label] = {"losses": [float(x) for x in losses], "grads": grads, "saved_peak": pipe.saved_peak,
                        "rng_after": float(torch.rand(1))}
    return found
