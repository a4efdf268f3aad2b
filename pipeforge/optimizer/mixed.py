"""The split work with each backward kept whole or split as data: one work graph for every choice.

``MixedWork`` over the split work's ``Graph`` (every B as its I and W, compiled once): an I node may
stand for its fused B (the B's duration, memory effect and action; its W left out of the order).
``view`` gives the graph that times a mix, ``flip`` changes one (stage, microbatch) pair by copying the
per-node lists, ``compiled`` turns a mix back into an ordinary graph and order (B where fused). So a
move of the fuse search costs a timing, not a compile. Why this is exact: ``docs/optimize.md``.
"""

from __future__ import annotations

from pipeforge.ir import Action, ActionKind
from pipeforge.optimizer.evaluate import Graph, Order
from pipeforge.semantics import SPLIT, stage_effect

B = ActionKind.B
I, W = SPLIT[B]  # noqa: E741  (B's parts: the I node stands for the fused B, its W is left out)


class MixedWork:
    """The split work graph and, per I node, what it becomes when it stands for its fused B."""

    def __init__(self, split: Graph):
        self.split = split
        index, problem = split.index, split.problem
        memory = problem.memory
        self.weight_of: dict[int, int] = {}  # I node -> its W node
        self.fused_action: dict[int, Action] = {}
        self.fused_duration: dict[int, float] = {}
        self.fused_effect: dict[int, tuple[float, float]] = {}  # (added, released)
        for node, action in enumerate(split.actions):
            if action.kind is not I:
                continue
            self.weight_of[node] = index[action._replace(kind=W)]
            self.fused_action[node] = action._replace(kind=B)
            self.fused_duration[node] = problem.costs.duration(B, action.stage)
            self.fused_effect[node] = stage_effect(memory, B, action.stage)

    def view(self, fused: frozenset[int]) -> Graph:
        """The graph that times a mix whose I nodes in ``fused`` stand for their B (a copy of the split
        graph's attributes: its ``index`` still maps the split actions only)."""
        view = self._copy(self.split)
        for node in fused:
            self._set(view, node, True)
        return view

    def flip(self, view: Graph, node: int, fused: bool) -> Graph:
        """``view`` with I node ``node`` standing for its B (``fused``) or for itself again."""
        changed = self._copy(view)
        self._set(changed, node, fused)
        return changed

    def _copy(self, graph: Graph) -> Graph:
        view = object.__new__(type(graph))
        view.__dict__.update(graph.__dict__)
        view.duration, view.delta = list(graph.duration), list(graph.delta)
        view.added, view.released, view.actions = list(graph.added), list(graph.released), list(graph.actions)
        return view

    def _set(self, view: Graph, node: int, fused: bool) -> None:
        split = self.split
        if fused:
            added, released = self.fused_effect[node]
            view.duration[node], view.actions[node] = self.fused_duration[node], self.fused_action[node]
        else:
            added, released = split.added[node], split.released[node]
            view.duration[node], view.actions[node] = split.duration[node], split.actions[node]
        view.added[node], view.released[node], view.delta[node] = added, released, added - released

    def mix_of(self, graph: Graph, order: Order) -> tuple[frozenset[int], Order]:
        """Any graph's order of this work as a mix: its fused I nodes and the order in split ids."""
        index, fused = self.split.index, []
        mixed = []
        for seq in order:
            nodes = []
            for a in seq:
                action = graph.actions[a]
                if action.kind is B:
                    action = action._replace(kind=I)
                    fused.append(index[action])
                nodes.append(index[action])
            mixed.append(tuple(nodes))
        return frozenset(fused), tuple(mixed)

    def compiled(self, view: Graph, order: Order) -> tuple[Graph, Order]:
        """A mix as an ordinary work graph of its actions (``Graph``) and the same order in its ids."""
        programs = [[view.actions[a] for a in seq] for seq in order]
        graph = Graph(self.split.problem, [a for seq in programs for a in seq])
        return graph, tuple(graph.ids(seq) for seq in programs)


__all__ = ["MixedWork"]
