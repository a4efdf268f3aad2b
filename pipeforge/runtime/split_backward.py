"""Backward split in two passes: I (gradients of the inputs) and W (gradients of the weights).

``SplitBackward`` (one per stage): ``backward_input`` (I) runs autograd from the stage's outputs to its
inputs only and records the gradient at each weight's frontier node, then frees the saved tensors of
every node W will not run (``release_saved``); ``accumulate_weight_gradients`` (W) starts at the
frontier and computes the weight gradients alone. I then W accumulates the same gradients as one full
backward, for any module (weights told apart by identity, an unreached weight gets none, frozen weights
and buffers are left alone), and nothing of I's work runs twice. How (frontier nodes, groups, what I
frees, what is kept between microbatches): ``docs/runtime-internals.md``; what it costs and holds
beside torch's: ``benchmarks/runtime/split_backward.py``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.autograd.graph import GradientEdge, Node


def grad_node(tensor: torch.Tensor) -> Node | None:
    """The autograd node of a tensor: its ``grad_fn``, or the accumulator of a leaf that needs a gradient."""
    if tensor.grad_fn is not None:
        return tensor.grad_fn
    if tensor.requires_grad:
        with torch.enable_grad():
            view = tensor.view_as(tensor).grad_fn
            assert view is not None, "a view of a tensor that requires a gradient has a node"
            return view.next_functions[0][0]
    return None


@dataclass(eq=False)
class WeightGroup:
    params: list[torch.nn.Parameter]
    nodes: list[Node]
    targets: tuple[GradientEdge, ...] = ()  # the weights' accumulators, where W's gradients are read
    grads: dict[Node, tuple] = field(default_factory=dict)


@dataclass(eq=False)
class WeightPlan:
    """What I leaves for W: the groups with their recorded gradients, and the weights that start at the outputs."""

    groups: list[WeightGroup]
    from_outputs: list[torch.nn.Parameter]
    roots: tuple[torch.Tensor, ...]
    root_grads: tuple
    whole: bool = False  # no input gradients wanted (a first stage): W is the stage's whole backward
    note: str = ""  # what the split did other than split (the step trace's label of the I)
    calls: tuple[tuple[int, ...], ...] | None = None  # the one-node groups of each engine call (Layout.calls)


@dataclass(frozen=True)
class Layout:
    """Where W starts, in positions: node ``n`` is the n-th node of the graph's walk, weight ``w`` the w-th weight."""

    groups: tuple[tuple[tuple[int, ...], tuple[int, ...]], ...]  # (weights, frontier nodes) of each group
    from_outputs: tuple[int, ...]
    released: tuple[int, ...] = ()  # the nodes W does not run: I frees their saved tensors
    calls: tuple[tuple[int, ...], ...] = ()  # the groups with one frontier node, by engine call of W


@dataclass(frozen=True)
class Graph:
    """One microbatch's autograd graph as the walk from its roots found it."""

    nodes: list[Node]
    position: dict[Node | None, int]  # (None, no node, is never in it)
    shape: tuple[tuple[int, ...], ...]  # the positions of each node's children

    def positions(self, nodes: Sequence[Node | None]) -> tuple[int, ...]:
        return tuple(self.position.get(n, -1) for n in nodes)


class SplitBackward:
    """The I/W split of one stage, with what it keeps from one microbatch to the next.

    - Each weight's accumulator node, kept with its weight and used only for
      that very object; a weight that leaves the stage's list is forgotten, one
      the graph does not reach through its kept accumulator is looked up again
      (its ``.data`` may have been swapped for another dtype, which gives it a
      new accumulator).
    - The analysis (``Layout``) of the last few graph shapes. The analysis is a
      function of the graph's shape and of the positions of its roots, inputs
      and weights' accumulators alone, so a graph equal in all four gets the
      kept analysis; any other graph (an MoE layer routing to other experts, a
      module that took another branch) is analysed afresh.
    """

    KEPT_LAYOUTS = 8

    def __init__(self) -> None:
        self._accumulators: dict[int, tuple[torch.nn.Parameter, Node | None]] = {}
        self._layouts: dict[tuple, Layout] = {}
        self.analysed = 0  # graphs analysed afresh (the others reused a kept layout)

    def backward_input(self, roots: tuple[torch.Tensor, ...], root_grads: tuple, inputs: list[torch.Tensor],
                       params: list[torch.nn.Parameter]) -> tuple[tuple, WeightPlan]:
        """Gradients of ``inputs`` (weights untouched), and the plan W needs."""
        if not inputs:  # nothing for I to do: every weight starts at the outputs, one reached by none gets None
            return (), WeightPlan([], [p for p in params if p.requires_grad], roots, root_grads, whole=True)
        accumulators = self._accumulator_nodes(params)
        root_nodes = [n for n in map(grad_node, roots) if n is not None]
        graph = walk(root_nodes)
        kinds = {type(node).__name__ for node in graph.nodes}
        if COMPILED_NODE in kinds:
            return _fused_input_pass(roots, root_grads, inputs)
        weights = graph.positions(accumulators)
        stale = [i for i, at in enumerate(weights) if at < 0]
        if stale:  # unreached, or a kept accumulator that is no longer the weight's: look it up again
            accumulators = self._refresh(params, accumulators, stale)
            weights = graph.positions(accumulators)
        inputs_at = graph.positions([grad_node(t) for t in inputs])
        layout = self.layout(graph, graph.positions(root_nodes), inputs_at, weights)
        plan = _plan(layout, graph, params, accumulators, roots, root_grads)
        found = _run_input_pass(plan, roots, root_grads, inputs)
        stuck = release_saved([graph.nodes[at] for at in layout.released])
        plan.note = "; ".join(([SPLIT_NOTE] if REGION_NODE in kinds else []) + ([stuck] if stuck else []))
        return found, plan

    def layout(self, graph: Graph, roots: tuple[int, ...], inputs: tuple[int, ...], weights: tuple[int, ...]) -> Layout:
        key = (graph.shape, roots, inputs, weights)
        found = self._layouts.get(key)
        if found is None:
            found = analyse(graph.shape, roots, inputs, weights)
            self.analysed += 1
            if len(self._layouts) >= self.KEPT_LAYOUTS:
                del self._layouts[next(iter(self._layouts))]
            self._layouts[key] = found
        return found

    def _accumulator_nodes(self, params: list[torch.nn.Parameter]) -> list[Node | None]:
        kept = self._accumulators
        fresh: dict[int, tuple[torch.nn.Parameter, Node | None]] = {}
        for param in params:
            entry = kept.get(id(param))
            if entry is None or entry[0] is not param:
                entry = (param, grad_node(param))
            fresh[id(param)] = entry
        self._accumulators = fresh
        return [fresh[id(p)][1] for p in params]

    def _refresh(self, params, accumulators: list[Node | None], stale: list[int]) -> list[Node | None]:
        accumulators = list(accumulators)
        for i in stale:
            accumulators[i] = grad_node(params[i])
            self._accumulators[id(params[i])] = (params[i], accumulators[i])
        return accumulators


COMPILED_NODE = "CompiledFunctionBackward"  # AOTAutograd's node: a torch.compile'd region of the graph
FUSED_NOTE = ("compiled region: the whole backward at I (input and weight gradients are one node's), W empty "
              "(pipeforge.models.compiled.split_backend compiles regions that split)")
REGION_NODE = "SplitRegionBackward"  # a region compiled with pipeforge.models.compiled.split_backend
SPLIT_NOTE = "compiled regions split: their input-gradient graphs at I, their weight-gradient graphs at W"


def _fused_input_pass(roots: tuple[torch.Tensor, ...], root_grads: tuple,
                      inputs: list[torch.Tensor]) -> tuple[tuple, WeightPlan]:
    """A graph holding a compiled region: its one backward node computes the input and the weight gradients
    together (and may free its buffers, so it runs once: AOTAutograd's donated buffers), so I runs the
    whole backward, as B does, and leaves W nothing. Exact; the split's overlap is lost for this stage."""
    run_backward(roots, root_grads)
    return tuple(t.grad for t in inputs), WeightPlan([], [], (), (), note=FUSED_NOTE)


def backward_input(roots: tuple[torch.Tensor, ...], root_grads: tuple, inputs: list[torch.Tensor],
                   params: list[torch.nn.Parameter], split: SplitBackward | None = None) -> tuple[tuple, WeightPlan]:
    """Gradients of ``inputs`` (weights untouched), and the plan W needs (``split``: the stage's kept state)."""
    return (split or SplitBackward()).backward_input(roots, root_grads, inputs, params)


def walk(roots: list[Node]) -> Graph:
    """Every node reachable from the roots, breadth first (the roots first), with its children's positions."""
    nodes: list[Node] = []
    position: dict[Node | None, int] = {}
    for root in roots:
        if root not in position:
            position[root] = len(nodes)
            nodes.append(root)
    shape = []
    for node in nodes:  # grows while it is read
        kids = []
        for child, _ in node.next_functions:
            if child is not None:
                at = position.get(child)
                if at is None:
                    at = position[child] = len(nodes)
                    nodes.append(child)
                kids.append(at)
        shape.append(tuple(kids))
    return Graph(nodes, position, tuple(shape))


def analyse(shape: tuple[tuple[int, ...], ...], roots: tuple[int, ...], inputs: tuple[int, ...],
            weights: tuple[int, ...]) -> Layout:
    """Where W starts for every weight, from one pass over the nodes (children before parents).

    A node is on the inputs' path when an input lies below it. Below a node off
    that path nothing is on it, so such a node reaches a set of weights (``below``)
    that W reaches from it alone; the frontier of a weight is every node on the
    path with a child off it that reaches the weight. A weight that an output
    off the path reaches starts at the outputs; one reached by no node is unused.
    """
    weight_at = {at: w for w, at in enumerate(weights) if at >= 0}
    on_path = {at for at in inputs if at >= 0}
    below: dict[int, frozenset[int]] = {}
    frontiers: dict[int, list[int]] = {}
    for node in _children_first(shape, roots):
        kids = shape[node]
        if node in on_path or any(k in on_path for k in kids):
            on_path.add(node)
            _add_frontier(node, kids, on_path, below, weight_at, frontiers)
        else:
            below[node] = _weights_below(node, kids, below, weight_at)
    at_outputs = set().union(*(below[r] for r in roots if r in below))
    frontiers = {w: nodes for w, nodes in frontiers.items() if w not in at_outputs}
    groups, from_outputs = _group_weights(frontiers), tuple(sorted(at_outputs))
    run = _run_by_weight_pass(shape, roots, weight_at, groups, from_outputs)
    return Layout(groups, from_outputs, tuple(n for n in range(len(shape)) if n not in run),
                  _engine_calls(shape, roots, groups))


def _engine_calls(shape: tuple[tuple[int, ...], ...], roots: tuple[int, ...],
                  groups: tuple[tuple[tuple[int, ...], tuple[int, ...]], ...]) -> tuple[tuple[int, ...], ...]:
    """The groups with one frontier node, in as few engine calls as runs no node twice: a group's level is
    one more than the highest level of a one-node group's frontier below its own (0 with none below), and
    each level is one call. Two frontier nodes of one level never reach each other, so a call starting
    at both runs what two calls would (any path from one to the other's weights passes the other's node:
    it is that weight's only frontier), and nothing between them."""
    single = {nodes[0]: g for g, (_, nodes) in enumerate(groups) if len(nodes) == 1}
    if len(single) < 2:
        return tuple((g,) for g in single.values())
    highest: dict[int, int] = {}  # node -> the highest level of a one-node frontier at or below it (-1: none)
    level: dict[int, int] = {}
    for node in _children_first(shape, roots):
        below = max((highest[k] for k in shape[node]), default=-1)
        if node in single:
            level[single[node]] = below + 1
            below += 1
        highest[node] = below
    calls: dict[int, list[int]] = {}
    for g in sorted(level):
        calls.setdefault(level[g], []).append(g)
    return tuple(tuple(gs) for _, gs in sorted(calls.items()))


def _run_by_weight_pass(shape: tuple[tuple[int, ...], ...], roots: tuple[int, ...], weight_at: dict[int, int],
                        groups: tuple[tuple[tuple[int, ...], tuple[int, ...]], ...],
                        from_outputs: tuple[int, ...]) -> set[int]:
    """The nodes W's engine calls run: for each call, the nodes below its start that reach one of its weights
    (as the engine finds what it must execute). Their saved tensors are what W needs; I frees the others'."""
    reach: dict[int, frozenset[int]] = {}
    for node in _children_first(shape, roots):
        reach[node] = _weights_below(node, shape[node], reach, weight_at)
    starts = [(nodes, frozenset(weights)) for weights, nodes in groups]
    if from_outputs:
        starts.append((roots, frozenset(from_outputs)))
    run: set[int] = set()
    for nodes, wanted in starts:
        seen: set[int] = set()
        stack = [n for n in nodes if reach.get(n, frozenset()) & wanted]
        while stack:
            node = stack.pop()
            if node in seen:
                continue
            seen.add(node)
            stack += [k for k in shape[node] if k not in seen and reach[k] & wanted]
        run |= seen
    return run


def _children_first(shape: tuple[tuple[int, ...], ...], roots: tuple[int, ...]) -> list[int]:
    order: list[int] = []
    done: set[int] = set()
    for root in roots:
        if root in done:
            continue
        done.add(root)
        stack = [(root, iter(shape[root]))]
        while stack:
            node, pending = stack[-1]
            for kid in pending:
                if kid not in done:
                    done.add(kid)
                    stack.append((kid, iter(shape[kid])))
                    break
            else:
                stack.pop()
                order.append(node)
    return order


def _weights_below(node: int, kids: tuple[int, ...], below: dict[int, frozenset[int]],
                   weight_at: dict[int, int]) -> frozenset[int]:
    own = weight_at.get(node)
    found = [below[k] for k in kids if below[k]]
    if own is None and len(found) <= 1:
        return found[0] if found else frozenset()
    return frozenset().union(*found, () if own is None else (own,))


def _add_frontier(node: int, kids: tuple[int, ...], on_path: set[int], below: dict[int, frozenset[int]],
                  weight_at: dict[int, int], frontiers: dict[int, list[int]]) -> None:
    for kid in kids:
        reached: tuple[int, ...] | frozenset[int]
        if kid in on_path:
            reached = (weight_at[kid],) if kid in weight_at else ()  # a weight that is itself an input
        else:
            reached = below[kid]
        for w in reached:
            nodes = frontiers.setdefault(w, [])
            if not nodes or nodes[-1] != node:
                nodes.append(node)


def _group_weights(frontiers: dict[int, list[int]]) -> tuple[tuple[tuple[int, ...], tuple[int, ...]], ...]:
    """Weights whose frontiers share a node go together (nodes compared by identity, not value)."""
    head_of: dict[int, int] = {}  # weight -> the first weight of its group
    members: dict[int, list[int]] = {}
    owner: dict[int, int] = {}  # node -> a weight whose frontier holds it
    for w in sorted(frontiers):
        joined = {head_of[owner[n]] for n in frontiers[w] if n in owner}
        head = min(joined, default=w)
        members[head] = sorted({w, *(m for g in joined for m in members.pop(g))})
        for m in members[head]:
            head_of[m] = head
        for n in frontiers[w]:
            owner[n] = w
    return tuple((tuple(weights), tuple(dict.fromkeys(n for m in weights for n in frontiers[m])))
                 for _, weights in sorted(members.items()))


class Releasable:
    """A saved tensor's packed value that I can free (``runtime/saved.py``'s, under its saved-tensor hooks)."""

    __slots__ = ()

    def free(self) -> None:
        raise NotImplementedError


_SAVED_FIELDS: dict[type, tuple[str, ...]] = {}  # a node type -> its saved tensors' attributes
OPAQUE_NODES = ("CopySlices",)  # nodes that hold another node's saved tensors where Python cannot reach them


def _saved_fields(node: Node) -> tuple[str, ...]:
    kind = type(node)
    names = _SAVED_FIELDS.get(kind)
    if names is None:
        names = _SAVED_FIELDS[kind] = tuple(n for n in dir(node) if n.startswith("_raw_saved_"))
    return names


def _used_after_release(_: int) -> torch.Tensor:
    raise RuntimeError("pipeforge: a saved tensor that the split backward's I released was used again "
                       "(a node W was not expected to run)")


def free_saved(saved) -> bool:
    """Free one saved tensor (a ``torch._C._autograd.SavedTensor``); False where it cannot be (other hooks)."""
    try:  # torch then keeps the saved value only through these hooks, which keep its id (a C call, no frame)
        saved.register_hooks(id, _used_after_release)
        return True
    except RuntimeError:  # hooks are set already, or it was freed, or nothing was saved there
        pass
    try:
        packed = getattr(saved, "data", None)  # under hooks: the packed value
    except RuntimeError:  # freed
        return True
    if packed is None:  # nothing was saved there
        return True
    if isinstance(packed, Releasable):
        packed.free()
        return True
    return False


def release_saved(nodes: list[Node]) -> str:
    """Free the saved tensors of ``nodes`` (the nodes W does not run, after I): "" where all went, else what
    was kept (a node holding another's saved tensors, a saved tensor under someone else's hooks)."""
    kept: dict[str, int] = {}
    fields = _SAVED_FIELDS
    for node in nodes:
        names = fields.get(type(node))
        if names is None:
            names = _saved_fields(node)
        if not names:
            if type(node).__name__ in OPAQUE_NODES:
                kept[type(node).__name__] = kept.get(type(node).__name__, 0) + 1
            continue
        for name in names:
            try:
                value = getattr(node, name)
            except RuntimeError:  # freed
                continue
            for saved in value if isinstance(value, (tuple, list)) else (value,):
                if saved is not None and not free_saved(saved):
                    kept[type(node).__name__] = kept.get(type(node).__name__, 0) + 1
    if not kept:
        return ""
    what = ", ".join(f"{name} x{count}" if count > 1 else name for name, count in sorted(kept.items()))
    return f"kept until W: saved tensors I cannot free ({what})"


def _plan(layout: Layout, graph: Graph, params, accumulators: list[Node | None], roots, root_grads) -> WeightPlan:
    groups = [WeightGroup([params[w] for w in weights], [graph.nodes[n] for n in nodes],
                          tuple(_accumulator_edge(accumulators[w]) for w in weights))
              for weights, nodes in layout.groups]
    return WeightPlan(groups, [params[w] for w in layout.from_outputs], roots, root_grads, calls=layout.calls)


def _accumulator_edge(node: Node | None) -> GradientEdge:
    """Where W reads a grouped weight's gradient (a weight in a group was reached: its accumulator is a node)."""
    assert node is not None, "a grouped weight has an accumulator in the graph"
    return GradientEdge(node, 0)


def _run_input_pass(plan: WeightPlan, roots, root_grads, inputs: list[torch.Tensor]) -> tuple:
    """Input gradients; the gradients arriving at the frontier nodes are read in the same pass (as extra
    ``inputs`` of ``autograd.grad``: an edge into a node gives the gradient the node receives there)."""
    entries = [(group, node, len(node._input_metadata)) for group in plan.groups for node in group.nodes]
    edges = [GradientEdge(node, k) for _, node, count in entries for k in range(count)]
    if not inputs and not edges:
        return ()
    found = gradients(roots, (*inputs, *edges), root_grads, True)
    at = len(inputs)
    for group, node, count in entries:
        group.grads[node] = found[at:at + count]
        at += count
    return found[:len(inputs)]


def held_gradients(plan: WeightPlan | None) -> list[torch.Tensor]:
    """The gradients a plan holds from its I to its W beside the saved tensors W reads: the roots' gradients
    (W starts at the outputs with them), those I recorded at the frontier nodes, and what a compiled
    region's I kept for its weight graph (``SplitRegion``'s ``kept``). Counted with the saved tensors by
    ``runtime/saved.py``'s ``hold_gradients`` (``Pipeline.saved_peak``, ``pipeforge profile``'s ``weight_grad``).
    None for a whole plan: its I did nothing, and its W holds what a B would (received gradients uncounted)."""
    if plan is None or plan.whole:
        return []
    held = [g for g in plan.root_grads if isinstance(g, torch.Tensor)]
    for group in plan.groups:
        for node in group.nodes:
            held += [g for g in group.grads.get(node, ()) if isinstance(g, torch.Tensor)]
            if type(node).__name__ == REGION_NODE:
                held += [t for t in getattr(node, "kept", None) or () if isinstance(t, torch.Tensor)]
    return held


def backward_weight(plan: WeightPlan) -> list[tuple[torch.nn.Parameter, torch.Tensor | None]]:
    """Every weight's gradient for this microbatch, computed from what I recorded.

    The graph is released as W goes where that is safe: the weights that start
    at the outputs go first (their paths may cross other groups' frontier
    nodes), then the groups with several frontier nodes (their calls may run
    nodes between those), then the groups with one, whose call runs only their
    nodes and the nodes below them towards their weights, which no other
    group reaches (a node reaching two groups' weights would join them); those
    go several to a call where no node of one reaches another's (``Layout.calls``).
    """
    results: list[tuple[torch.nn.Parameter, torch.Tensor | None]] = []
    if plan.from_outputs:
        found = gradients(plan.roots, tuple(plan.from_outputs), plan.root_grads, bool(plan.groups))
        results += list(zip(plan.from_outputs, found))
    for group in plan.groups:
        if len(group.nodes) > 1:
            results += _group_gradients([group], keep_graph=True)
    calls = plan.calls if plan.calls is not None else tuple(
        (g,) for g, group in enumerate(plan.groups) if len(group.nodes) == 1)
    for call in calls:
        results += _group_gradients([plan.groups[g] for g in call], keep_graph=False)
    return results


def accumulate_weight_gradients(plan: WeightPlan) -> None:
    """W into the weights' ``.grad`` (added to what is there). A first stage's W runs its whole backward
    the way B does (``torch.autograd.backward``: one pass, each weight's gradient accumulated as it comes)."""
    if plan.whole:
        run_backward(plan.roots, plan.root_grads)
        return
    for param, grad in backward_weight(plan):
        if grad is None:
            continue
        if param.grad is None:
            param.grad = grad
        else:
            param.grad += grad


def _group_gradients(groups: list[WeightGroup],
                     keep_graph: bool) -> list[tuple[torch.nn.Parameter, torch.Tensor | None]]:
    """The weights' gradients of ``groups`` in one engine call (several: groups with one frontier node each)."""
    edges: list[GradientEdge] = []
    grads: list[torch.Tensor] = []
    params: list[torch.nn.Parameter] = []
    targets: list[GradientEdge] = []
    unreached: list[tuple[torch.nn.Parameter, torch.Tensor | None]] = []
    for group in groups:
        started = len(edges)
        for node in group.nodes:
            for index, grad in enumerate(group.grads[node]):
                if grad is not None:
                    edges.append(GradientEdge(node, index))
                    grads.append(grad)
        if len(edges) == started:  # nothing reached the group's nodes in I
            unreached += [(p, None) for p in group.params]
            continue
        params += group.params
        targets += group.targets
    if not edges:
        return unreached
    handles = []
    if len(groups) == 1 and len(groups[0].nodes) > 1:  # a lower frontier node keeps the gradient I recorded for it
        group = groups[0]
        handles = [node.register_prehook(lambda _, saved=group.grads[node]: saved) for node in group.nodes]
    try:
        found = _run_engine(tuple(edges), tuple(grads), tuple(targets), keep_graph)
    finally:
        for handle in handles:
            handle.remove()
    return list(zip(params, found)) + unreached


# torch's own entry point to its engine
_ENGINE: Callable[..., Any] | None = getattr(torch.autograd.graph, "_engine_run_backward", None)
# the engine itself, which ``_ENGINE`` calls after registering logging hooks (with torch.autograd's debug
# logging on) and lending the caller's context variables to the engine's device threads (CUDA's): a graph
# rooted on the CPU, without that logging, calls it at once (``_accumulate``)
_EXECUTION_ENGINE = getattr(getattr(torch.autograd, "variable", None), "Variable", None)
_RUN_BACKWARD: Callable[..., Any] | None = getattr(getattr(_EXECUTION_ENGINE, "_execution_engine", None),
                                                   "run_backward", None)
_AUTOGRAD_LOG = logging.getLogger("torch.autograd.graph")


def _accumulate(roots: tuple[torch.Tensor, ...], grads: tuple[torch.Tensor, ...]) -> None:
    """The engine's backward from ``roots`` with ``grads`` (their shapes), accumulating into ``.grad``."""
    on_cpu = roots[0].is_cpu if len(roots) == 1 else all([root.is_cpu for root in roots])
    if _RUN_BACKWARD is not None and on_cpu and not _AUTOGRAD_LOG.isEnabledFor(logging.DEBUG):
        _RUN_BACKWARD(roots, grads, False, False, (), True, True)
    elif _ENGINE is not None:
        _ENGINE(roots, grads, False, False, (), True, True)
    else:
        torch.autograd.backward(roots, grads)


def run_backward(roots: tuple[torch.Tensor, ...], grads: tuple[torch.Tensor | None, ...]) -> None:
    """``torch.autograd.backward(roots, grads)``: every leaf's ``.grad`` accumulated, the graph freed
    (the engine called at once where ``engine_grads`` allows)."""
    given = engine_grads(roots, grads)
    if given is None or _ENGINE is None:  # (engine_grads is None where _ENGINE is)
        torch.autograd.backward(roots, grads)
    else:
        _accumulate(roots, given)


class ScalarSeed:
    """The gradient one of a scalar root (a stage's loss), made once and given to the engine again while
    nothing wrote into it and the root keeps its dtype, its number of dimensions and its device (a plain
    tensor's)."""

    __slots__ = ("tensor", "dtype", "dim", "on_cpu")

    def __init__(self) -> None:
        self.tensor: torch.Tensor | None = None
        self.dtype: torch.dtype | None = None  # the seed's, read once when made (a getter a call less)
        self.dim = -1
        self.on_cpu = False

    def backward(self, root: torch.Tensor) -> None:
        """``run_backward((root,), (None,))`` with this seed: ``root``'s graph run, ``.grad`` accumulated.
        ``root`` has one element (a loss: ``StageRunner.forward`` checks), so one of the seed's number of
        dimensions has its shape."""
        seed = self.tensor
        if (seed is None or seed._version or root.dtype is not self.dtype or root.dim() != self.dim
                or root.is_cpu is not self.on_cpu or (not self.on_cpu and seed.device != root.device)):
            seed = self._make(root)
            if seed is None:
                run_backward((root,), (None,))
                return
        if self.on_cpu and _RUN_BACKWARD is not None and not _AUTOGRAD_LOG.isEnabledFor(logging.DEBUG):
            _RUN_BACKWARD((root,), (seed,), False, False, (), True, True)  # ``_accumulate``'s, one call less
        else:
            _accumulate((root,), (seed,))

    def _make(self, root: torch.Tensor) -> torch.Tensor | None:
        """A seed for ``root``, kept for the next (``None``: not a floating-point scalar, left to torch's checks)."""
        if _ENGINE is None or root.numel() != 1 or not root.is_floating_point():
            return None
        seed = torch.ones_like(root, memory_format=torch.preserve_format)
        # a subclass's (a DTensor's) made each time
        self.tensor = seed if type(root) is torch.Tensor else None
        self.dtype, self.dim, self.on_cpu = seed.dtype, seed.dim(), seed.is_cpu
        return seed


def gradients(roots: tuple[torch.Tensor, ...], inputs: tuple, grads: tuple[torch.Tensor | None, ...],
              keep_graph: bool) -> tuple[torch.Tensor | None, ...]:
    """``torch.autograd.grad(roots, inputs, grads, retain_graph=keep_graph, allow_unused=True)``
    (the engine called at once where ``engine_grads`` allows)."""
    given = engine_grads(roots, grads)
    if given is None or _ENGINE is None:  # (engine_grads is None where _ENGINE is)
        return torch.autograd.grad(roots, inputs, grads, retain_graph=keep_graph, allow_unused=True)
    return _ENGINE(roots, given, keep_graph, False, inputs, True, False)


def engine_grads(roots: tuple[torch.Tensor, ...], grads: tuple[torch.Tensor | None, ...]) -> tuple | None:
    """The roots' gradients as torch's engine takes them (``None`` of a scalar root: one), or ``None``
    where torch's own checks must run and raise their error.

    The runtime's root gradients are the roots' own shapes (received into buffers
    made from the outputs, zeros like them, or ``None`` for a scalar loss), so the
    runtime calls the engine without ``backward``'s and ``grad``'s Python checks,
    which take about as long as a small stage's own backward. A gradient of
    another shape, or a ``None`` for a root that is not a floating-point scalar,
    is left to torch's checks.
    """
    if _ENGINE is None:
        return None
    given = []
    for root, grad in zip(roots, grads):
        if grad is None:
            if root.numel() != 1 or not root.is_floating_point():
                return None
            grad = torch.ones_like(root, memory_format=torch.preserve_format)
        elif grad.shape != root.shape:
            return None
        given.append(grad)
    return tuple(given)


def _run_engine(edges: tuple[GradientEdge, ...], grads: tuple[torch.Tensor, ...],
                targets: tuple[GradientEdge, ...], keep_graph: bool) -> tuple[torch.Tensor | None, ...]:
    """``torch.autograd.grad(edges, targets, grads, retain_graph=keep_graph, allow_unused=True)``.

    The gradients were recorded at these very edges by the engine in I, so
    ``autograd.grad``'s checks of their shapes and types (a good part of a small
    group's time) are skipped where torch offers its engine entry point.
    """
    if _ENGINE is None:
        return torch.autograd.grad(edges, targets, grads, retain_graph=keep_graph, allow_unused=True)
    return _ENGINE(edges, grads, keep_graph, False, targets, True, False)
