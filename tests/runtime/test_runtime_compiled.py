"""torch.compile'd stage modules under the library schedules, split backward included.

A compiled region is one autograd node (AOTAutograd's ``CompiledFunctionBackward``)
whose backward computes input and weight gradients together, once (its donated
buffers forbid running it again). Where a schedule splits the backward of such a
graph, I runs the stage's whole backward and W nothing, and the step trace's I
event says so. The gradients must equal the uncompiled modules' in float64.
``aot_eager`` is the compile backend here: the same AOTAutograd node as inductor,
without a C++ toolchain and the minutes inductor needs per graph on a loaded CPU.
"""

from __future__ import annotations

import tempfile

import pytest

import pipeforge
from pipeforge.generator import codegen
from pipeforge.runtime.split_backward import FUSED_NOTE
from pipeforge.tools.launch import spawn

SCHEDULES = ("1f1b", "zb-h1", "interleaved-zb", "zbv", "dualpipev")
MICROBATCHES = 4


def compiled_against_eager(rank: int, nproc: int, paths: dict[str, str]) -> dict[str, float]:
    import copy

    import torch

    from pipeforge.tools.generated import load_module

    torch.set_default_dtype(torch.float64)
    torch._dynamo.config.cache_size_limit = 64  # every stage module of every schedule is compiled once
    found = {}
    for name, path in paths.items():
        module = load_module(path)
        torch.manual_seed(0)
        full = [torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 4))
                for _ in range(module.SCHEDULE.stages)]
        mine = module.stages_of_rank(rank)
        eager = {s: copy.deepcopy(full[s]) for s in mine}
        compiled = {s: torch.compile(copy.deepcopy(full[s]), backend="aot_eager", dynamic=False) for s in mine}
        x = torch.randn(16, 4, generator=torch.Generator().manual_seed(1))
        y = torch.randn(16, 4, generator=torch.Generator().manual_seed(2))
        grads, notes = {}, set()
        for key, stages in (("eager", eager), ("compiled", compiled)):
            pipe = module.make_pipeline(stages, loss_fn=torch.nn.functional.mse_loss, timeout=120)
            pipe.trace = key == "compiled"
            pipe.step(*((x,) if pipe.holds_first else ()), target=y if pipe.holds_last else None)
            grads[key] = [p.grad for s in mine for p in stages[s].parameters()]
            if pipe.trace:
                notes = {e.label for e in pipe.last_trace.events if e.kind == "I" and e.stage != 0}
        assert all(g is not None for g in grads["compiled"]), name
        found[name] = max((a - b).abs().max().item() for a, b in zip(grads["eager"], grads["compiled"]))
        found[f"{name} I notes"] = sorted(notes)
    return found


@pytest.mark.distributed
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_compiled_stages_give_the_eager_gradients_under_every_split_schedule():
    with tempfile.TemporaryDirectory() as out:
        paths = {name: str(codegen(pipeforge.load(name, defines={"P": 2, "M": MICROBATCHES}), f"{out}/{name}"))
                 for name in SCHEDULES}
        outcomes = spawn(compiled_against_eager, 2, paths, timeout=300, deadline=840)
    assert all(o.ok for o in outcomes), "\n".join(o.error for o in outcomes if not o.ok)
    for outcome in outcomes:
        assert {name: outcome.value[name] for name in SCHEDULES} == dict.fromkeys(SCHEDULES, 0.0), outcome.value
    for name in SCHEDULES:  # every split I of a stage with inputs says what it did; 1F1B has none
        notes = sorted({note for outcome in outcomes for note in outcome.value[f"{name} I notes"]})
        assert notes == ([] if name == "1f1b" else [FUSED_NOTE]), (name, notes)
