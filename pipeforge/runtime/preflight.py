"""``Pipeline.check``: one microbatch's forward through every stage before the first step, errors named.

``check(pipeline, args, kwargs, target, shared, per_stage)``, called on every rank with the arguments it
will give ``step()``: each rank's inputs are checked and every rank learns every rank's problems (one
all-gather); then stage after stage the rank holding it runs microbatch 0 and broadcasts its output's
shapes or what went wrong (a non-tensor output, an exception in the module, a ``loss_fn`` that is not a
scalar, reentrant checkpointing where backward is split). So every rank raises the same
``PipelineUsageError``, naming the rank, the stage and the inputs, and none waits for a peer. Buffers
and the random state are restored; parameters, gradients and the user's data are untouched (the stages
run on copies). ``docs/runtime.md``
(Errors).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from pipeforge.ir import ActionKind
from pipeforge.runtime.aux import unwrap as unwrap_aux
from pipeforge.runtime.microbatch import as_tuple, copied, split_value, to_device
from pipeforge.runtime.objects import all_gather_objects, broadcast_object
from pipeforge.runtime.p2p import PipelineError, PipelineUsageError
from pipeforge.runtime.saved import unkept_inputs
from pipeforge.semantics import RUNTIME_METHODS

if TYPE_CHECKING:
    from torch.autograd.graph import Node

REENTRANT = "CheckpointFunctionBackward"  # torch.utils.checkpoint(..., use_reentrant=True)'s autograd node


def check(pipeline, args: tuple, kwargs: dict, target: Any, shared: Any, per_stage: Any, *,
          training: bool = True, run_stages: bool = True) -> bool:
    """``training``: the arguments of ``step()`` (False: of ``eval()``, whose target is optional and whose
    backward is never split). ``run_stages`` False on any rank: every rank checks the inputs alone (the
    first step's automatic check of data-parallel stages); returns whether the stages ran."""
    prepared, problem = _prepare(pipeline, args, kwargs, target, shared, per_stage, training)
    gathered = _gather(pipeline, (problem, run_stages))
    problems = [p for p, _ in gathered]
    if any(problems):
        found = "; ".join(p for p in problems if p)
        raise PipelineUsageError(f"rank {pipeline.rank}: pipeline check: {found}")
    if not all(runs for _, runs in gathered):
        return False
    buffers = _buffers(pipeline)
    devices = [pipeline.transport.device] if pipeline.transport.device.type == "cuda" else []
    try:
        with torch.random.fork_rng(devices=devices):
            _run_stages(pipeline, prepared, training)
    finally:
        _restore(buffers)
    return True


def _prepare(pipeline, args, kwargs, target, shared, per_stage, training: bool) -> tuple[dict, str | None]:
    try:
        refused = pipeline.refusal(target, training)
        if refused:
            raise PipelineUsageError(refused)
        stage_inputs = pipeline._stage_inputs(shared, per_stage)
        batch = pipeline._batch(args, kwargs, stage_inputs.get(0))
        targets = None
        if target is not None:
            target = to_device(target, pipeline.transport.device)
            targets = split_value(target, pipeline.info.microbatches, f"rank {pipeline.rank}: target")
        unkept = unkept_inputs(pipeline.info, pipeline.rank, batch, stage_inputs.get(0))
        return {"inputs": stage_inputs, "batch": batch, "targets": targets}, unkept
    except PipelineError as error:
        return {}, str(error)


def _gather(pipeline, problem: Any) -> list:
    return all_gather_objects(problem, group=pipeline.transport.group, device=pipeline.transport.device)


def _run_stages(pipeline, prepared: dict, training: bool) -> None:
    info, rank = pipeline.info, pipeline.rank
    outputs: dict[int, tuple] = {}
    reported: tuple = ()
    for stage in range(info.stages):
        owner = info.rank_of(stage, 0)
        result: Any = None
        if owner == rank:
            result = _run_stage(pipeline, prepared, stage, outputs.get(stage - 1), reported, training)
            if isinstance(result, tuple):
                outputs[stage] = result
                result = [(tuple(t.shape), t.dtype, t.requires_grad) if isinstance(t, torch.Tensor) else None
                          for t in result]
        result = broadcast_object(result, src=pipeline.transport.global_rank(owner), group=pipeline.transport.group,
                                  device=pipeline.transport.device)
        if isinstance(result, str):
            raise PipelineUsageError(f"rank {rank}: pipeline check: stage {stage} on rank {owner}: {result}")
        reported = tuple(result or ())


def _run_stage(pipeline, prepared: dict, stage: int, local: tuple | None, reported: tuple, training: bool):
    """The stage's output tensors, or what went wrong (a string)."""
    runner = pipeline.runners[(stage, 0)]
    if stage == 0:  # a copy of the user's first microbatch: a module changing its input in place changes no data
        args, kwargs = copied(prepared["batch"][0])
    else:
        # as the step makes them: wanting a gradient where the stage before made it with one (the shapes header's),
        # given as copies, as the step gives them to a stage that changes them in place (``StageRunner._given``)
        args = local if local is not None else tuple(_stand_in(meta, pipeline.transport.device) for meta in reported)
        args = tuple(a.detach().requires_grad_(training and a.requires_grad and a.is_floating_point()).clone()
                     if isinstance(a, torch.Tensor) else a for a in args)
        kwargs = {}
    own = prepared["inputs"].get(stage)
    kwargs = {**kwargs, **(copied(own[0]) if own else {})}
    try:
        with torch.set_grad_enabled(training):  # an eval's forward runs without gradients
            output, _ = unwrap_aux(runner.module(*args, **kwargs), f"stage {stage}")
    except Exception as error:  # noqa: BLE001 - any failure of the user's module is reported, named
        return f"its module raised {type(error).__name__}: {error} (called with {_describe_call(args, kwargs)})"
    found: tuple | str
    if not runner.is_last:
        if not _sendable(output):
            return (f"its module returned {_describe(output)}; a stage before the last must return a tensor or a "
                    "tuple of tensors (of a ModelOutput or a dict, return the tensor the next stage takes, e.g. "
                    "output.last_hidden_state; of (h, None), return h)")
        found = as_tuple(output)
    else:
        found = _loss_problem(runner, output, prepared["targets"], training)
        if isinstance(found, str):
            return found
    if training and _splits_backward(pipeline) and _reentrant(found):
        return ("it uses reentrant activation checkpointing (torch.utils.checkpoint with use_reentrant=True), "
                f"whose backward cannot be split into I and W, and rank {pipeline.rank}'s program of schedule "
                f"{pipeline.info.name!r} splits it: pass use_reentrant=False (Hugging Face: "
                "gradient_checkpointing_enable(gradient_checkpointing_kwargs={'use_reentrant': False}))")
    return tuple(found)


def _loss_problem(runner, output, targets, training: bool) -> tuple | str:
    if targets is None or runner.loss_fn is None:
        return tuple(t for t in as_tuple(output) if isinstance(t, torch.Tensor))
    try:
        loss = runner.loss_fn(output, copied(targets[0]))
    except Exception as error:  # noqa: BLE001
        return f"loss_fn raised {type(error).__name__}: {error} (on the stage's output {_describe(output)})"
    if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
        return f"loss_fn returned {_describe(loss)}; it must return a scalar tensor"
    if training and not loss.requires_grad:
        return (f"loss_fn returned {_describe(loss)} that does not require grad: step() has nothing to train "
                "(no parameter of the stages up to here and no input needs a gradient, or loss_fn detached it)")
    return (loss,)


def _sendable(output: Any) -> bool:
    if isinstance(output, torch.Tensor):
        return True
    return type(output) in (tuple, list) and bool(output) and all(isinstance(t, torch.Tensor) for t in output)


def _splits_backward(pipeline) -> bool:
    code = getattr(pipeline._program, "__code__", None)
    return code is not None and RUNTIME_METHODS[ActionKind.I] in code.co_names


def _reentrant(tensors) -> bool:
    seen: set[int] = set()
    todo: list[Node | None] = [t.grad_fn for t in tensors if isinstance(t, torch.Tensor) and t.grad_fn is not None]
    while todo:
        node = todo.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        if REENTRANT in type(node).__name__:
            return True
        todo.extend(next_node for next_node, _ in node.next_functions)
    return False


def _stand_in(meta, device: torch.device):
    if meta is None:
        return None
    shape, dtype, requires_grad = meta
    return torch.zeros(shape, dtype=dtype, device=device).requires_grad_(requires_grad)


def _describe(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"Tensor {list(value.shape)} {str(value.dtype).removeprefix('torch.')}"
    if isinstance(value, dict):
        return f"{type(value).__name__} with keys {list(value)}"
    if isinstance(value, (tuple, list)):
        inner = ", ".join(_describe(v) for v in value)
        return f"({inner})" if isinstance(value, tuple) else f"[{inner}]"
    return type(value).__name__ if value is not None else "None"


def _describe_call(args: tuple, kwargs: dict) -> str:
    parts = [_describe(a) for a in args] + [f"{k}={_describe(v)}" for k, v in kwargs.items()]
    return f"{len(args)} positional input(s): " + ", ".join(parts) if parts else "no inputs"


def _buffers(pipeline) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(b, b.detach().clone()) for m in pipeline.modules() for b in m.buffers()]


def _restore(buffers) -> None:
    with torch.no_grad():
        for buffer, saved in buffers:
            buffer.copy_(saved)
