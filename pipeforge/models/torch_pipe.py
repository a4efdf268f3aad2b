"""A torch ``pipeline()`` split (a ``torch.distributed.pipelining.Pipe``) as pipeforge stage modules.

``split_pipe(pipe, stages, owned)`` reads ``pipe.split_gm``'s graph: which stage (``submod_i``) takes
which value (a model input, or an output of an earlier stage). Stage ``s`` becomes an ``fx.GraphModule``
of torch's own submodule graph that takes the values live across the cut before it and returns those
live across the cut after it: a value a stage beyond the next one needs (the attention mask stage 0
makes for every GPT-2 block) rides through the stages between unchanged, so every edge is adjacent.
Stage 0 takes the model's inputs (all of them, by position or name); the last stage returns the last
submodule's output. Parameters keep the model's names; torch's replicated parameters (a tied embedding
and head, copied per submodule) are the ``tied_parameters`` groups. ``docs/models.md#torch-pipeline-splits``.
"""

from __future__ import annotations

import inspect
import operator
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import fx, nn

from pipeforge.errors import UsageError

Value = tuple  # ("input", name) for a model input, ("stage", s, index or None) for a stage's output


def is_torch_pipe(model) -> bool:
    return hasattr(model, "split_gm") and hasattr(model, "replicated_params") and hasattr(model, "num_stages")


@dataclass(frozen=True)
class PipeGraph:
    """What ``pipe.split_gm``'s graph says: the stages in order, the inputs, who takes what."""

    inputs: tuple[fx.Node, ...]  # the model's inputs (placeholders), in order
    calls: tuple[fx.Node, ...]  # stage s is calls[s] (torch's _PipelineStage numbers them so)
    args: tuple[tuple[Value, ...], ...]  # the values each stage takes, in its argument order
    produced: tuple[tuple[Value, ...], ...]  # the values each stage makes that the graph uses
    live: tuple[tuple[Value, ...], ...]  # live[c]: the values crossing the cut between stage c and c + 1


def read_graph(pipe) -> PipeGraph:
    if getattr(pipe, "has_loss_and_backward", False):
        raise UsageError("pipeforge.split: the torch Pipe computes its loss and backward inside (a loss spec); "
                         "split the model without its loss and give make_pipeline a loss_fn")
    graph = pipe.split_gm.graph
    inputs = tuple(n for n in graph.nodes if n.op == "placeholder")
    for node in inputs:
        if node.target.startswith("*"):
            raise UsageError(f"pipeforge.split: the torch Pipe takes {node.target!r}; only named inputs can be "
                             "given to stage 0")
    calls = tuple(n for n in graph.nodes if n.op == "call_module")
    stage_of = {node: s for s, node in enumerate(calls)}
    values: dict[fx.Node, Value] = {node: ("input", node.target) for node in inputs}
    for node in graph.nodes:
        if node.op == "call_module":
            values[node] = ("stage", stage_of[node], None)
        elif node.op == "call_function" and node.target is operator.getitem and node.args[0] in stage_of:
            values[node] = ("stage", stage_of[node.args[0]], node.args[1])
        elif node.op not in ("placeholder", "output"):
            raise UsageError(f"pipeforge.split: the torch Pipe's graph holds {node.op} {node.target} "
                             f"({node.name!r}) between its stages; pipeforge knows stages, inputs and outputs only")
    args = []
    for s, node in enumerate(calls):
        if node.kwargs:
            raise UsageError(f"pipeforge.split: stage {s} ({node.target}) takes keyword arguments "
                             f"{sorted(node.kwargs)} in the Pipe's graph; only positional ones are known")
        bad = [a for a in node.args if not isinstance(a, fx.Node) or a not in values]
        if bad:
            raise UsageError(f"pipeforge.split: stage {s} ({node.target}) takes {bad[0]!r}, "
                             "neither a model input nor an earlier stage's output")
        args.append(tuple(values[a] for a in node.args))
    output = next(n for n in graph.nodes if n.op == "output")
    for value in (values[n] for n in _nodes_in(output.args)):
        if value[0] != "stage" or value[1] != len(calls) - 1:
            raise UsageError(f"pipeforge.split: the model's output holds {_describe(value)}, not computed by the "
                             f"last stage ({len(calls) - 1}); a pipeline returns the last stage's output only")
    produced = [tuple(dict.fromkeys(v for a in args for v in a if v[0] == "stage" and v[1] == s))
                for s in range(len(calls))]
    live = []
    for cut in range(len(calls) - 1):
        later = {v for a in args[cut + 1:] for v in a}
        made = [v for v in values.values() if v[0] == "input"] + [v for s in range(cut + 1) for v in produced[s]]
        live.append(tuple(v for v in dict.fromkeys(made) if v in later))
    return PipeGraph(inputs, calls, tuple(args), tuple(produced), tuple(live))


def _nodes_in(args) -> list[fx.Node]:
    found: list[fx.Node] = []
    fx.node.map_arg(args, found.append)
    return found


def _describe(value: Value) -> str:
    if value[0] == "input":
        return f"the model's input {value[1]!r}"
    index = "" if value[2] is None else f"[{value[2]}]"
    return f"output{index} of stage {value[1]}"


def _name(value: Value) -> str:
    if value[0] == "input":
        return str(value[1])
    return f"stage{value[1]}_out" + ("" if value[2] is None else f"{value[2]}")


def stage_module(pipe, found: PipeGraph, stage: int) -> fx.GraphModule:
    """Stage ``stage``: torch's submodule graph between the values live before it and those live after."""
    submod = pipe.split_gm.get_submodule(found.calls[stage].target)
    last = stage == len(found.calls) - 1
    graph = fx.Graph()
    env: dict[Value, fx.Node] = {}
    if stage == 0:
        for node in found.inputs:
            env[("input", node.target)] = graph.placeholder(str(node.target), default_value=_default(node))
    else:
        for value in found.live[stage - 1]:
            env[value] = graph.placeholder(_name(value))
    inner = [n for n in submod.graph.nodes if n.op == "placeholder"]
    if len(inner) != len(found.args[stage]):
        raise UsageError(f"pipeforge.split: stage {stage} ({found.calls[stage].target}) has {len(inner)} inputs in "
                         f"its graph and {len(found.args[stage])} in the Pipe's")
    result: Any = graph.graph_copy(submod.graph, {p: env[v] for p, v in zip(inner, found.args[stage])})
    if last:
        graph.output(result)
    else:
        for value in found.produced[stage]:
            env[value] = result if value[2] is None else result[value[2]]
        after = [env[v] for v in found.live[stage]]
        graph.output(after[0] if len(after) == 1 else tuple(after))
    module = fx.GraphModule(submod, graph, class_name=f"TorchPipeStage{stage}")
    module.meta["pipeforge_inputs"] = [p.target for p in graph.nodes if p.op == "placeholder"]
    return module


def _default(node: fx.Node):
    return node.args[0] if node.args else inspect.Signature.empty


def traced_shapes(found: PipeGraph) -> dict[str, tuple]:
    """The shape each tensor input of the model had when ``pipeline()`` traced it (one microbatch's)."""
    shapes = {}
    for node in found.inputs:
        value = node.meta.get("val")
        if isinstance(value, torch.Tensor) and all(isinstance(d, int) for d in value.shape):
            shapes[str(node.target)] = tuple(value.shape)
    return shapes


def check_microbatch_shapes(module: nn.Module, names: Sequence[str], shapes: dict[str, tuple]) -> None:
    """Stage 0 refuses a microbatch whose shape is not the traced one (the graph has the shapes baked in)."""

    def check(_module, args, kwargs):
        given = dict(zip(names, args)) | kwargs
        for name, value in given.items():
            want = shapes.get(name)
            if want is not None and isinstance(value, torch.Tensor) and tuple(value.shape) != want:
                raise UsageError(f"stage 0 argument {name!r}: a microbatch of shape {tuple(value.shape)}, but the "
                                 f"torch Pipe was traced with shape {want} (its graph keeps the traced shapes): trace "
                                 "pipeline() with one microbatch (the batch's rows / microbatches)")

    module.register_forward_pre_hook(check, with_kwargs=True)


def tied_groups(pipe, found: PipeGraph, modules: Mapping[int, nn.Module]) -> list[list[tuple[int, str]]]:
    """torch's replicated parameters (one copy per submodule) as ``tied_parameters`` groups of the stages."""
    stage_of = {node.target: s for s, node in enumerate(found.calls)}
    groups = []
    for mapping in pipe.replicated_params:
        group = []
        for submod_name, name in mapping.items():
            stage = stage_of.get(submod_name)
            if stage is None or name not in dict(modules[stage].named_parameters()):
                continue  # a copy no stage's graph uses
            group.append((stage, name))
        if len({stage for stage, _ in group}) > 1:
            groups.append(sorted(group))
    return sorted(groups)


def move_to(module: nn.Module, device: torch.device) -> None:
    """The module's tensors and the devices its graphs name (``pipeline()`` traces them in) on ``device``."""
    module.to(device)
    for sub in module.modules():
        graph = getattr(sub, "graph", None)
        if not isinstance(graph, fx.Graph):
            continue
        for node in graph.nodes:
            if isinstance(node.kwargs.get("device"), torch.device) and node.kwargs["device"] != device:
                node.update_kwarg("device", device)
        if isinstance(sub, fx.GraphModule):
            sub.recompile()


def cut_pipe(pipe, stages: int, *, verify: bool = True) -> tuple[dict[int, fx.GraphModule], list]:
    """Every stage of ``pipe`` (see the module docstring) and the tied groups."""
    found = read_graph(pipe)
    if len(found.calls) != stages:
        raise UsageError(f"pipeforge.split: the torch Pipe has {len(found.calls)} stages, and stages={stages}; "
                         "a Pipe is split where pipeline() cut it")
    every = {s: stage_module(pipe, found, s) for s in range(stages)}
    check_microbatch_shapes(every[0], every[0].meta["pipeforge_inputs"], traced_shapes(found))
    if verify:
        verify_pipe(pipe, found, every)
    return every, tied_groups(pipe, found, every)


def verify_pipe(pipe, found: PipeGraph, every: dict[int, fx.GraphModule]) -> None:
    """The stages chained on the traced inputs give the Pipe's own output, bit for bit (no gradients)."""
    values = [node.meta.get("val") for node in found.inputs]
    example = [v for v in values if isinstance(v, torch.Tensor)]
    if len(example) != len(values):
        return
    if any(isinstance(v, torch._subclasses.FakeTensor) or v.is_meta for v in example):
        example = [_example_like(v) for v in example]
    if any(t.is_meta for m in every.values() for t in [*m.parameters(), *m.buffers()]):
        return
    with torch.random.fork_rng(), torch.no_grad():
        state = torch.random.get_rng_state()  # a graph traced in training mode draws its dropout masks
        try:
            want = _tensors(pipe(*example))
        except Exception as error:
            raise UsageError(f"pipeforge.split: the torch Pipe itself fails on inputs of its traced shapes, so "
                             f"its split is wrong before pipeforge runs it ({type(error).__name__}: "
                             f"{_first_line(error)})") from error
        torch.random.set_rng_state(state)
        got: object = example
        for s in range(len(every)):
            try:
                got = every[s](*(got if isinstance(got, (tuple, list)) else (got,)))
            except Exception as error:
                raise UsageError(f"pipeforge.split: stage {s} of the torch Pipe fails on inputs of its traced "
                                 f"shapes ({type(error).__name__}: {_first_line(error)})") from error
    got = _tensors(got)
    if len(got) != len(want) or not all(a.shape == b.shape and torch.equal(a, b) for a, b in zip(got, want)):
        raise UsageError("pipeforge.split: the stages cut from the torch Pipe do not compute the Pipe's output on "
                         "its traced inputs; pass verify=False to cut it anyway")


def _first_line(error: Exception) -> str:
    return next((line for line in str(error).splitlines() if line.strip()), "")


def _tensors(value) -> list:
    if isinstance(value, (tuple, list)):
        return [t for v in value for t in _tensors(v)]
    return [value] if isinstance(value, torch.Tensor) else []


def _example_like(value: torch.Tensor) -> torch.Tensor:
    generator = torch.Generator().manual_seed(0)
    if value.dtype.is_floating_point:
        return torch.randn(value.shape, generator=generator, dtype=value.dtype)
    if value.dtype == torch.bool:
        return torch.ones(value.shape, dtype=torch.bool)
    return torch.randint(0, 2, value.shape, generator=generator, dtype=value.dtype)
