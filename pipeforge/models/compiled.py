"""A ``torch.compile`` backend whose compiled regions keep the backward split into I and W.

``split_backend(backend)`` wraps a compile backend (``"inductor"``, ``"aot_eager"``, ...):
``torch.compile(block, backend=split_backend("inductor"))`` or ``block.compile(backend=...)``.
Each region dynamo captures is traced with its backward, and the backward is cut in two
graphs, input gradients and weight gradients (the region's ``nn.Parameter`` inputs), each
compiled by ``backend``. The region is one autograd node (``SplitRegionBackward``) that runs
only the graphs its caller needs: I gets the input gradients, keeps what the weight graph reads
and frees the other saved values; W runs the weight graph and frees the rest; a full backward
runs both (freeing is then the engine's). A backward needing what I or W freed raises. A region that
writes into its inputs (batch norm's statistics) is compiled plainly, one fused node. Gradients
are the region's own (bit for bit the eager ones with ``aot_eager``). How: ``docs/runtime-internals.md``.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import fx
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.autograd.function import once_differentiable
from torch.fx.experimental.proxy_tensor import make_fx

from pipeforge.runtime.split_backward import free_saved



def split_backend(backend: str | Callable = "inductor") -> Callable:
    """A ``torch.compile`` backend: ``backend`` compiles the region's forward, input-gradient and
    weight-gradient graphs, which run as one autograd node whose backward splits into I and W."""
    inner = torch._dynamo.lookup_backend(backend) if isinstance(backend, str) else backend

    def compile_region(gm: fx.GraphModule, example_inputs: Sequence[Any]) -> Callable:
        if not all(isinstance(t, torch.Tensor) for t in example_inputs):  # symbolic sizes: the plain region
            return inner(gm, list(example_inputs))
        return CapturedRegion(gm, [t for t in example_inputs], inner)

    compile_region.__name__ = f"split_{getattr(backend, '__name__', backend)}"
    return compile_region


class CapturedRegion:
    """One captured region: the plain compiled graph without gradients, the split graphs with them."""

    def __init__(self, gm: fx.GraphModule, example_inputs: list[torch.Tensor], inner: Callable):
        self.gm, self.inner = gm, inner
        self.weights = tuple(isinstance(t, torch.nn.Parameter) for t in example_inputs)
        self._plain: Callable | None = None
        self._graphs: RegionGraphs | Callable | None = None

    def __call__(self, *args: torch.Tensor) -> Any:
        # dynamo guards grad mode and every input's requires_grad: a region sees one case for life
        if not torch.is_grad_enabled() or not any(a.requires_grad for a in args):
            if self._plain is None:
                self._plain = self.inner(self.gm, list(args))
            return self._plain(*args)
        if self._graphs is None:
            with _unhooked():  # the caller's saved-tensor hooks see no fake tensor (the runtime's counting reads data)
                self._graphs = trace_region(self.gm, args, self.weights, self.inner) or self.inner(self.gm, list(args))
        if not isinstance(self._graphs, RegionGraphs):  # compiled plainly: one fused node
            return self._graphs(*args)
        return self._graphs.structure(SplitRegion.apply(self._graphs, *args))


@dataclass
class RegionGraphs:
    """The compiled forward, input-gradient and weight-gradient graphs of a region, and how they connect."""

    forward: Callable  # args -> outputs + saved
    input_grads: Callable  # saved it reads + tangents -> grads of the inputs + kept (what the weight graph needs)
    weight_grads: Callable  # saved it reads + tangents + kept -> grads of the weights
    outputs: int
    differentiable: tuple[int, ...]  # output positions that get a tangent
    saved_args: tuple[int, ...]  # the args the backward graphs read, saved as they are
    input_reads: tuple[int, ...]  # the saved values (positions: saved args, then the forward's) each graph reads
    weight_reads: tuple[int, ...]
    input_only: tuple[int, ...]  # those the weight graph does not read: I frees them
    inputs_at: tuple[int, ...]  # the args whose gradients the input graph gives (in its order)
    weights_at: tuple[int, ...]
    tangent_metas: tuple[tuple[torch.Size, torch.dtype, torch.device], ...]  # a missing gradient's zeros
    structure: Callable  # the region's outputs as the captured graph returns them


class SplitRegion(torch.autograd.Function):
    @staticmethod
    def forward(ctx, graphs: RegionGraphs, *args: torch.Tensor):
        found = graphs.forward(*args)
        outputs, saved = found[:graphs.outputs], found[graphs.outputs:]
        ctx.graphs, ctx.kept, ctx.count, ctx.freed = graphs, None, len(args), frozenset()
        # saved detached (the same memory and version counter): a saved output would need its node to unpack,
        # which unpacking one saved value at a time cannot give under saved-tensor hooks
        ctx.save_for_backward(*(args[i].detach() for i in graphs.saved_args), *(t.detach() for t in saved))
        ctx.mark_non_differentiable(*(o for i, o in enumerate(outputs) if i not in graphs.differentiable))
        return tuple(outputs)

    @staticmethod
    @once_differentiable
    def backward(ctx, *grads: torch.Tensor | None):
        graphs: RegionGraphs = ctx.graphs
        nodes = [node for node, _ in ctx.next_functions]
        tangents = [_tangent(grads[i], meta) for i, meta in zip(graphs.differentiable, graphs.tangent_metas)]
        result: list[torch.Tensor | None] = [None] * (1 + ctx.count)
        # a gradient returned for an input this call does not want is dropped by the engine
        inputs = ctx.kept is None or any(_will_run(nodes[i]) for i in graphs.inputs_at)
        weights = any(_will_run(nodes[i]) for i in graphs.weights_at)
        if inputs:
            found = graphs.input_grads(*_saved(ctx, graphs.input_reads, "input"), *tangents)
            for i, grad in zip(graphs.inputs_at, found):
                result[1 + i] = grad
            ctx.kept = found[len(graphs.inputs_at):]
        if weights:
            found = graphs.weight_grads(*_saved(ctx, graphs.weight_reads, "weight"), *tangents, *ctx.kept)
            for i, grad in zip(graphs.weights_at, found):
                result[1 + i] = grad
            ctx.kept = None
        if inputs and not weights and graphs.weights_at:  # I: what W does not read goes
            _release(ctx, graphs.input_only)
        elif weights and not inputs:  # W, after its I: both graphs have run, the rest goes
            _release(ctx, graphs.weight_reads)
        return tuple(result)


def _saved(ctx, reads: tuple[int, ...], graph: str) -> list[torch.Tensor]:
    """The saved values a graph reads, unpacked one by one (the others may be freed already)."""
    if ctx.freed.intersection(reads):
        raise RuntimeError(
            f"pipeforge: a region compiled with split_backend ran its {graph}-gradient graph again after its "
            f"backward freed the saved values that graph reads (the input-gradient pass frees what the "
            f"weight-gradient graph does not read, the weight-gradient pass the rest): a region's backward "
            f"runs once per forward, whole or as I then W; compile with a plain backend to backward through "
            f"it again")
    raw = ctx._raw_saved_tensors
    return [raw[k].unpack() for k in reads]


def _release(ctx, positions: tuple[int, ...]) -> None:
    """Free the saved values at ``positions`` (those under hooks that cannot free them stay, still correct)."""
    raw = ctx._raw_saved_tensors
    ctx.freed = ctx.freed | {k for k in positions if k not in ctx.freed and free_saved(raw[k])}


def _unhooked():
    """Saved-tensor hooks that keep each tensor as it is, over the caller's: tracing saves fake tensors."""
    return torch.autograd.graph.saved_tensors_hooks(_same, _same)


def _same(tensor: torch.Tensor) -> torch.Tensor:
    return tensor


def _will_run(node) -> bool:
    """Whether this backward call wants the gradient of the input behind ``node``: the engine runs the node, or
    (a leaf whose gradient ``autograd.grad`` returns, which torch will not answer for) the node is a target."""
    if node is None:
        return False
    try:
        return torch._C._will_engine_execute_node(node)
    except RuntimeError:  # "a leaf node was passed ... running autograd.grad()": it is one of the targets
        return True


def _tangent(grad: torch.Tensor | None, meta: tuple[torch.Size, torch.dtype, torch.device]) -> torch.Tensor:
    if grad is None:  # an output nothing used
        return torch.zeros(meta[0], dtype=meta[1], device=meta[2])
    return grad.contiguous()  # the graphs were compiled for contiguous gradients


def _writes(traced: fx.GraphModule) -> bool:
    """Whether the graph holds an operation that writes into a tensor (a mutable schema)."""
    return any(isinstance(n.target, torch._ops.OpOverload) and n.target._schema.is_mutable for n in traced.graph.nodes)


def trace_region(gm: fx.GraphModule, args: Sequence[torch.Tensor], weights: tuple[bool, ...],
                 inner: Callable) -> RegionGraphs | None:
    """Trace the region with its backward (``make_fx`` over ``autograd.grad``) and cut the joint graph in three:
    the forward (what the outputs need), the input gradients (what they need beyond the forward), and the
    weight gradients (the rest); each compiled by ``inner`` for the shapes of ``args``. Writes into the
    region's own values are functionalized first; ``None`` for a region that writes into its inputs (a buffer),
    which the caller compiles plainly."""
    with FakeTensorMode() as fake, torch.enable_grad():  # the outputs' kinds, without running the region
        probe = gm(*(fake.from_tensor(a) for a in args))
    flat = list(probe) if isinstance(probe, (tuple, list)) else [probe]
    differentiable = tuple(i for i, o in enumerate(flat) if isinstance(o, torch.Tensor) and o.requires_grad)
    wanting = tuple(i for i, a in enumerate(args) if a.requires_grad)
    metas = tuple((flat[i].shape, flat[i].dtype, flat[i].device) for i in differentiable)

    def joint(*values: torch.Tensor):
        primals, tangents = values[:len(args)], values[len(args):]
        with torch.enable_grad():
            outputs = gm(*primals)
            outputs = list(outputs) if isinstance(outputs, (tuple, list)) else [outputs]
            grads = torch.autograd.grad([outputs[i] for i in differentiable], [primals[i] for i in wanting],
                                        tangents, allow_unused=True)
        return (*outputs, *grads)

    tangents = [torch.zeros(shape, dtype=dtype, device=device) for shape, dtype, device in metas]
    traced = make_fx(joint, tracing_mode="fake")(*args, *tangents)
    if _writes(traced):  # writes into its own values (Falcon's add_, div_) become pure ops, traced again;
        # views stay views: a view made a copy changes the strides a matmul reads, and with them its rounding
        traced = make_fx(torch.func.functionalize(traced, remove="mutations"),
                         tracing_mode="fake")(*args, *tangents)
    if _writes(traced):
        return None  # a region that writes into its inputs (batch norm's statistics): compiled plainly
    cut = cut_joint(traced, len(args), len(flat), [weights[i] for i in wanting])
    inputs_at = tuple(wanting[k] for k in cut.input_positions)
    weights_at = tuple(wanting[k] for k in cut.weight_positions)
    with torch.no_grad():
        forward, input_grads, weight_grads = (inner(g, [_example(n) for n in g.graph.find_nodes(op="placeholder")])
                                              for g in cut.graphs)
    structure = (lambda out: out) if isinstance(probe, tuple) else (
        (lambda out: list(out)) if isinstance(probe, list) else (lambda out: out[0]))
    return RegionGraphs(forward, input_grads, weight_grads, outputs=len(flat), differentiable=differentiable,
                        saved_args=cut.saved_args, input_reads=cut.input_reads, weight_reads=cut.weight_reads,
                        input_only=tuple(k for k in cut.input_reads if k not in cut.weight_reads),
                        inputs_at=inputs_at, weights_at=weights_at, tangent_metas=metas, structure=structure)


def _example(node: fx.Node) -> torch.Tensor:
    val = node.meta["val"]
    return torch.empty_strided(val.shape, val.stride(), dtype=val.dtype, device=val.device)


@dataclass
class Cut:
    graphs: tuple[fx.GraphModule, fx.GraphModule, fx.GraphModule]  # forward, input gradients, weight gradients
    saved_args: tuple[int, ...]
    input_reads: tuple[int, ...]  # the saved values each backward graph reads (positions among them)
    weight_reads: tuple[int, ...]
    input_positions: tuple[int, ...]  # among the gradients the joint graph returns
    weight_positions: tuple[int, ...]


def cut_joint(joint: fx.GraphModule, args: int, outputs: int, is_weight: list[bool]) -> Cut:
    """The three graphs of a joint graph whose placeholders are ``args`` primals then the tangents, and whose
    outputs are ``outputs`` forward values then one gradient per wanted primal (``is_weight`` says which are
    weights). A node goes to the first graph that needs it; a value one graph makes and a later one reads
    is an output of the first and an input of the later one."""
    nodes = list(joint.graph.nodes)
    placeholders = [n for n in nodes if n.op == "placeholder"]
    primals, tangents = placeholders[:args], placeholders[args:]
    returned = list(joint.graph.output_node().args[0])  # type: ignore[arg-type]
    forward_out, grads = returned[:outputs], returned[outputs:]
    input_positions = tuple(k for k, w in enumerate(is_weight) if not w and grads[k] is not None)
    weight_positions = tuple(k for k, w in enumerate(is_weight) if w and grads[k] is not None)
    forward = _with_parts(_needed(forward_out, set()))
    inputs = _with_parts(_needed([grads[k] for k in input_positions], forward))
    weights = _needed([grads[k] for k in weight_positions], forward | inputs)
    later = inputs | weights
    saved = [n for n in nodes if n.op == "placeholder" and n in primals and _read_by(n, later, grads)]
    saved += [n for n in nodes if n in forward and _read_by(n, later, grads)]
    input_grads, weight_grads = [grads[k] for k in input_positions], [grads[k] for k in weight_positions]
    kept = [n for n in nodes if n in inputs and _read_by(n, weights, weight_grads)]
    input_reads = tuple(k for k, n in enumerate(saved) if _read_by(n, inputs, input_grads))
    weight_reads = tuple(k for k, n in enumerate(saved) if _read_by(n, weights, weight_grads))

    def build(ins: list[fx.Node], body: set[fx.Node], outs: list[fx.Node]) -> fx.GraphModule:
        graph, env = fx.Graph(), {}
        for n in ins:
            env[n] = graph.placeholder(n.name)
            env[n].meta = dict(n.meta)
        for n in nodes:
            if n in body:
                env[n] = graph.node_copy(n, lambda a: env[a])
        graph.output(tuple(env[n] for n in outs))
        return fx.GraphModule(joint, graph)

    saved_args = tuple(primals.index(n) for n in saved if n in primals)
    graphs = (build(primals, forward, [*forward_out, *(n for n in saved if n not in primals)]),
              build([*(saved[k] for k in input_reads), *tangents], inputs, [*input_grads, *kept]),
              build([*(saved[k] for k in weight_reads), *tangents, *kept], weights, weight_grads))
    return Cut(graphs, saved_args, input_reads, weight_reads, input_positions, weight_positions)


def _needed(roots: list[Any], done: set[fx.Node]) -> set[fx.Node]:
    """The non-placeholder nodes the roots need that ``done`` does not hold already."""
    found: set[fx.Node] = set()
    stack = [r for r in roots if isinstance(r, fx.Node)]
    while stack:
        node = stack.pop()
        if node in found or node in done or node.op == "placeholder":
            continue
        found.add(node)
        stack += node.all_input_nodes
    return found


def _with_parts(found: set[fx.Node]) -> set[fx.Node]:
    """With every part taken of a node that returns several values (a tuple is never passed between graphs)."""
    return found | {user for node in found for user in node.users if user.target is operator.getitem}


def _read_by(node: fx.Node, body: set[fx.Node], outs: list[Any]) -> bool:
    return any(user in body for user in node.users) or any(o is node for o in outs)
