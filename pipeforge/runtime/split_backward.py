"""Backward split in two passes: I (gradients of the inputs) and W (gradients of the weights).

The idea follows torch's ``stage_backward_input`` / ``stage_backward_weight``:
I runs autograd from the stage's outputs to its inputs only, and on the way
records the gradient arriving at every *frontier* node, the first node on a
weight's path to the outputs that also lies on the inputs' path (for a linear
layer, its ``AddmmBackward``). W then starts autograd at those frontier nodes,
with the recorded gradients, towards the weights alone, so the weight-gradient
products run in W and nothing of I's work runs twice.

Weights sharing a frontier node form one group (one ``torch.autograd.grad``
call). When a group starts from several nodes, one may lie below another; a
pre-hook then replaces the gradient flowing into the lower node with the one I
recorded there, so nothing is counted twice. Weights with no frontier node
(the first stage, whose inputs need no gradient, or a weight on a branch the
inputs never reach, or a weight also used on such a branch) get their
gradients from the outputs in W.

Groups and nodes are told apart by identity, never by value (two weights of one
shape are two groups). A weight the graph never reached (an MoE expert no token
was routed to) gets no gradient, as in a full backward; frozen weights and
buffers are not asked for.
"""

from __future__ import annotations

from collections import defaultdict, deque
from dataclasses import dataclass, field

import torch
from torch.autograd.graph import GradientEdge, Node


def grad_node(tensor: torch.Tensor) -> Node | None:
    """The autograd node of a tensor: its ``grad_fn``, or the accumulator of a leaf that needs a gradient."""
    if tensor.grad_fn is not None:
        return tensor.grad_fn
    if tensor.requires_grad:
        with torch.enable_grad():
            return tensor.view_as(tensor).grad_fn.next_functions[0][0]
    return None


@dataclass(eq=False)
class WeightGroup:
    params: list[torch.nn.Parameter]
    nodes: list[Node]
    grads: dict[Node, tuple] = field(default_factory=dict)


@dataclass(eq=False)
class WeightPlan:
    """What I leaves for W: the groups with their recorded gradients, and the weights that start at the outputs."""

    groups: list[WeightGroup]
    from_outputs: list[torch.nn.Parameter]
    roots: tuple[torch.Tensor, ...]
    root_grads: tuple


def _parents(roots: list[Node]) -> dict[Node, list[Node]]:
    """For every node reachable from the roots, the nodes that feed it its gradient."""
    parents: dict[Node, list[Node]] = defaultdict(list)
    seen, queue = set(roots), deque(roots)
    while queue:
        node = queue.popleft()
        for child, _ in node.next_functions:
            if child is None:
                continue
            parents[child].append(node)
            if child not in seen:
                seen.add(child)
                queue.append(child)
    return parents


def _upwards(starts: list[Node], parents: dict[Node, list[Node]], stop: set[Node]) -> tuple[set[Node], set[Node]]:
    """Nodes reached from ``starts`` towards the outputs, not entering ``stop``; and the ``stop`` nodes met."""
    reached, met, queue = set(starts), set(), deque(starts)
    while queue:
        for parent in parents.get(queue.popleft(), ()):
            if parent in stop:
                met.add(parent)
            elif parent not in reached:
                reached.add(parent)
                queue.append(parent)
    return reached, met


def _group_weights(params: list[torch.nn.Parameter], frontiers: list[set[Node]]) -> list[WeightGroup]:
    """Weights whose frontiers share a node go together (groups compared by identity, not value)."""
    groups: dict[int, WeightGroup] = {}
    owner: dict[Node, WeightGroup] = {}
    for param, nodes in zip(params, frontiers):
        group = WeightGroup([param], list(nodes))
        for other in {id(owner[n]): owner[n] for n in nodes if n in owner}.values():
            group.params = other.params + group.params
            group.nodes = other.nodes + [n for n in group.nodes if n not in other.nodes]
            del groups[id(other)]
        groups[id(group)] = group
        for node in group.nodes:
            owner[node] = group
    return list(groups.values())


def _frontier(node: Node | None, parents: dict[Node, list[Node]], on_input_path: set[Node],
              root_nodes: set[Node]) -> set[Node] | None:
    """Where W starts for one weight: its frontier nodes; empty to start at the outputs; None if unused."""
    if node is None or (node not in parents and node not in root_nodes):
        return None
    reached, met = _upwards([node], parents, on_input_path)
    if reached & root_nodes:  # a path to the outputs that avoids the inputs' path: start there
        return set()
    return met


def backward_input(roots: tuple[torch.Tensor, ...], root_grads: tuple, inputs: list[torch.Tensor],
                   params: list[torch.nn.Parameter]) -> tuple[tuple, WeightPlan]:
    """Gradients of ``inputs`` (weights untouched), and the plan W needs."""
    input_nodes = [n for n in map(grad_node, inputs) if n is not None]
    root_nodes = [n for n in map(grad_node, roots) if n is not None]
    parents = _parents(root_nodes)
    on_input_path, _ = _upwards(input_nodes, parents, set())
    frontiers = [_frontier(grad_node(p), parents, on_input_path, set(root_nodes)) for p in params]
    reached = [i for i, f in enumerate(frontiers) if f]
    groups = _group_weights([params[i] for i in reached], [frontiers[i] for i in reached])
    from_outputs = [p for p, f in zip(params, frontiers) if f is not None and not f]
    plan = WeightPlan(groups, from_outputs, roots, root_grads)
    handles = [node.register_prehook(_recorder(group, node)) for group in plan.groups for node in group.nodes]
    try:
        found = torch.autograd.grad(roots, inputs, root_grads, retain_graph=True, allow_unused=True) if inputs else ()
    finally:
        for handle in handles:
            handle.remove()
    return tuple(found), plan


def _recorder(group: WeightGroup, node: Node):
    def record(grad_outputs):
        group.grads[node] = tuple(grad_outputs)

    return record


def backward_weight(plan: WeightPlan) -> list[tuple[torch.nn.Parameter, torch.Tensor | None]]:
    """Every weight's gradient for this microbatch, computed from what I recorded."""
    results: list[tuple[torch.nn.Parameter, torch.Tensor | None]] = []
    from_outputs = list(plan.from_outputs)
    for group in plan.groups:
        if any(node not in group.grads for node in group.nodes):
            from_outputs += group.params  # a frontier I never reached: start this group at the outputs
            continue
        results += _group_gradients(group)
    if from_outputs:
        found = torch.autograd.grad(plan.roots, from_outputs, plan.root_grads, retain_graph=True, allow_unused=True)
        results += list(zip(from_outputs, found))
    return results


def _group_gradients(group: WeightGroup) -> list[tuple[torch.nn.Parameter, torch.Tensor | None]]:
    edges, grads = [], []
    for node in group.nodes:
        for index, grad in enumerate(group.grads[node]):
            if grad is not None:
                edges.append(GradientEdge(node, index))
                grads.append(grad)
    if not edges:
        return [(p, None) for p in group.params]
    handles = []
    if len(group.nodes) > 1:  # a lower frontier node keeps the gradient I recorded for it
        handles = [node.register_prehook(lambda _, saved=group.grads[node]: saved) for node in group.nodes]
    try:
        targets = [GradientEdge(grad_node(p), 0) for p in group.params]
        found = torch.autograd.grad(edges, targets, grads, retain_graph=True, allow_unused=True)
    finally:
        for handle in handles:
            handle.remove()
    return list(zip(group.params, found))
