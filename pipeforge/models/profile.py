"""Per-layer costs of a model, measured in this process, as ``pipeforge plan`` reads them.

``layer_costs(model, batch, attention_mask=None, repeats=5)`` cuts the model
into one stage per layer (``split(..., layers=[1] * L)``: stage 0 also embeds,
the last stage also predicts), runs each stage through the runtime's own
``StageRunner`` (forward, then backward for inputs and for weights, as the
split-backward schedules run them) on ``batch`` ``repeats`` times, and returns
the median F, I, W of every layer (ms) and the bytes its forward leaves saved
for backward (``activation``). What stage 0 and the last stage take beyond the
median layer is ``first`` and ``last``: the embedding's and the head's cost.
"""

from __future__ import annotations

import statistics
import time

import torch

from pipeforge.errors import UsageError


def layer_costs(model: torch.nn.Module, batch: torch.Tensor, *, attention_mask: torch.Tensor | None = None,
                repeats: int = 5) -> dict:
    from pipeforge.models.split import split
    from pipeforge.runtime.stage import StageRunner

    probe = split(model, 1)
    count = len(probe.layers[0])
    if count < 3:
        raise UsageError(f"layer_costs: the model has {count} layers; at least 3 tell a layer from the ends")
    cut = split(model, count, layers=[1] * count)
    runners = [StageRunner(cut.modules[s], s, 0, s == 0, s == count - 1, _loss if s == count - 1 else None)
               for s in range(count)]
    kwargs = {"attention_mask": attention_mask} if attention_mask is not None else {}
    times = {s: {"F": [], "I": [], "W": []} for s in range(count)}
    saved = [0] * count
    for _ in range(repeats + 1):  # the first round warms up
        _round(runners, batch, kwargs, times, saved)
    for s in range(count):
        for kind in times[s]:
            times[s][kind] = times[s][kind][1:]
    per_stage = [{k: 1e3 * statistics.median(v) for k, v in times[s].items()} for s in range(count)]
    middle = per_stage[1:-1]
    layer = {k: statistics.median(m[k] for m in middle) for k in ("F", "I", "W")}
    activation = statistics.median(saved[1:-1])
    layers = [{**(layer if s in (0, count - 1) else per_stage[s]),
               "activation": float(activation if s in (0, count - 1) else saved[s])} for s in range(count)]
    return {"units": "ms", "layers": layers,
            "first": {k: max(per_stage[0][k] - layer[k], 0.0) for k in layer},
            "last": {k: max(per_stage[-1][k] - layer[k], 0.0) for k in layer}}


def _loss(output, target):
    return output.float().mean() if not output.is_floating_point() else output.mean()


def _round(runners, batch, kwargs, times, saved) -> None:
    value = batch
    for runner in runners:
        counted = [0]

        def pack(tensor, counted=counted):
            counted[0] += tensor.numel() * tensor.element_size()
            return tensor

        started = time.perf_counter()
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            value = runner.forward(0, (value,), None, True, kwargs)
        times[runner.stage]["F"].append(time.perf_counter() - started)
        saved[runner.stage] = counted[0]
    grads = None
    for runner in reversed(runners):
        started = time.perf_counter()
        input_grads = runner.backward_input(0, grads)
        middle = time.perf_counter()
        runner.backward_weight(0)
        times[runner.stage]["I"].append(max(middle - started, 1e-9))
        times[runner.stage]["W"].append(max(time.perf_counter() - middle, 1e-9))
        grads = input_grads
    for runner in runners:
        for param in runner.module.parameters():
            param.grad = None
        runner.reset()
