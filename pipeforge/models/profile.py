"""Per-layer costs of a model, measured in this process, as ``pipeforge plan`` reads them.

``layer_costs(model, batch, attention_mask=None, repeats=5)`` cuts the model
into one stage per layer (``split(..., layers=[1] * L)``: stage 0 also embeds,
the last stage also predicts), runs each stage through the runtime's own
``StageRunner`` (forward, then backward for inputs and for weights, as the
split-backward schedules run them) on ``batch`` ``repeats`` times, and returns
the median F, I, W of every layer (ms), the bytes its forward leaves saved for
backward as the runtime counts them (``activation``: ``runtime.saved.counted``, a
parameter's storage excepted) and the bytes of its parameters (``parameters``). What
stage 0 and the last stage take beyond the median layer is ``first`` and ``last``:
the embedding's and the head's cost (stage 0's whole backward runs in its W).
``load_layer_model(path)`` reads the model file of ``pipeforge profile --per-layer``.
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
    times: dict[int, dict[str, list[float]]] = {s: {"F": [], "I": [], "W": []} for s in range(count)}
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
    weights = [_parameter_bytes(cut.modules[s]) for s in range(count)]
    weight = statistics.median(weights[1:-1])
    layers = [{**(layer if s in (0, count - 1) else per_stage[s]),
               "activation": float(activation if s in (0, count - 1) else saved[s]),
               "parameters": float(weight if s in (0, count - 1) else weights[s])} for s in range(count)]
    return {"units": "ms", "layers": layers,
            "first": {**_first_extra(per_stage[0], layer), "parameters": float(max(weights[0] - weight, 0))},
            "last": {**{k: max(per_stage[-1][k] - layer[k], 0.0) for k in layer},
                     "parameters": float(max(weights[-1] - weight, 0))}}


def _first_extra(stage0: dict[str, float], layer: dict[str, float]) -> dict[str, float]:
    """What stage 0 takes beyond a layer. Its inputs need no gradient, so its I does nothing and its W
    runs its whole backward, its layer's I included: the extra backward is the difference of the sums."""
    backward = stage0["I"] + stage0["W"] - layer["I"] - layer["W"]
    return {"F": max(stage0["F"] - layer["F"], 0.0), "I": 0.0, "W": max(backward, 0.0)}


def _parameter_bytes(module: torch.nn.Module) -> int:
    """The bytes of a stage module's parameters, each once (a tied weight held twice counts once)."""
    return sum(p.numel() * p.element_size() for p in {id(p): p for p in module.parameters()}.values())


LAYER_FUNCTION = "pipeforge_layers"


def load_layer_model(path: str) -> dict:
    """``pipeforge profile --per-layer``'s model file: ``pipeforge_layers()`` returns ``{"model": the whole
    model (a Hugging Face causal LM, an ``nn.Sequential`` or a module with a list of layers), "batch": its
    input, "attention_mask": optional}``; anything else is a ``UsageError`` naming the file."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("pipeforge_user_layers", path)
    if spec is None or spec.loader is None:  # a name Python imports no module from (not *.py)
        raise UsageError(f"{path}: not a Python module file (a .py file defining {LAYER_FUNCTION}())")
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as error:  # noqa: BLE001 (the user's file: its error, named, exit 2)
        raise UsageError(f"{path}: importing it raised {type(error).__name__}: {error}") from None
    make = getattr(module, LAYER_FUNCTION, None)
    if not callable(make):
        raise UsageError(f"{path}: defines no function {LAYER_FUNCTION}() (docs/profile.md, per layer)")
    found = make()
    if not isinstance(found, dict) or "model" not in found or "batch" not in found:
        raise UsageError(f"{path}: {LAYER_FUNCTION}() must return a dict with 'model' and 'batch' "
                         f"(and optionally 'attention_mask'), got {type(found).__name__}"
                         + (f" with keys {sorted(found)}" if isinstance(found, dict) else ""))
    if not isinstance(found["model"], torch.nn.Module) or not isinstance(found["batch"], torch.Tensor):
        raise UsageError(f"{path}: {LAYER_FUNCTION}(): 'model' must be a torch.nn.Module and 'batch' a tensor")
    return found


def _loss(output, target):
    return output.float().mean() if not output.is_floating_point() else output.mean()


def _round(runners, batch, kwargs, times, saved) -> None:
    from pipeforge.runtime.saved import SavedBytes, counted

    value = batch
    for runner in runners:
        # the runtime's own accounting (each storage saved tensors keep alive once, a parameter's not at all)
        counter = SavedBytes()
        parameters = {p.untyped_storage().data_ptr() for p in runner.module.parameters()}
        started = time.perf_counter()
        with counted(counter, parameters, None, ((value,), kwargs)):  # the layer's inputs: their own bytes
            value = runner.forward(0, (value,), None, True, kwargs)
        times[runner.stage]["F"].append(time.perf_counter() - started)
        saved[runner.stage] = counter.held
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
