"""Spawned workers for tests/runtime/test_runtime_unkept.py: a recomputed stage 0 given no tensor input."""

from __future__ import annotations

import torch
from torch import nn

WAIT = 30


class FromAnIterator(nn.Module):
    """Stage 0 of a model that reads its data from a stream of its own: its input is a count, not a tensor."""

    def __init__(self):
        super().__init__()
        self.inner = nn.Linear(3, 3)
        self.stream = iter(torch.randn(100, 2, 3).unbind())

    def forward(self, scale):
        return self.inner(next(self.stream) * scale)


def refused(rank: int, nproc: int, path: str) -> dict:
    from pipeforge.runtime import PipelineUsageError
    from pipeforge.tools.generated import load_module

    generated = load_module(path)
    info = generated.SCHEDULE
    torch.manual_seed(0)
    modules = [FromAnIterator()] + [nn.Linear(3, 3) for _ in range(info.stages - 1)]
    mine = {s: modules[s] for s in info.stages_of(rank)}
    before = [p.detach().clone() for m in mine.values() for p in m.parameters()]
    found: dict = {}
    for preflight in (True, False):  # the first step's automatic check, or step()'s own refusal
        pipe = generated.make_pipeline(mine, loss_fn=lambda out, y: ((out - y) ** 2).mean(), timeout=WAIT)
        pipe.preflight = preflight
        arguments = (5,) if pipe.holds_first else ()
        target = torch.zeros(2 * info.microbatches, 3) if pipe.holds_last else None
        for call in (("check", "step", "step again") if preflight else ("step", "step again")):
            try:
                getattr(pipe, call.split()[0])(*arguments, target=target)
            except PipelineUsageError as error:
                found[call + ("" if preflight else ", no preflight")] = str(error)
            else:
                found[call] = "ran"
    after = [p for m in mine.values() for p in m.parameters()]
    found["untouched"] = all(p.grad is None for p in after) and all(torch.equal(a, b) for a, b in zip(after, before))
    return found
