"""Plain PyTorch models cut into stages: an ``nn.Sequential``, or modules around one list of layers.

``list_parts(model)`` gives ``(before, layers, after)``: for an ``nn.Sequential``
its children are the layers; for another module its children in registration
order are the modules before its one ``nn.ModuleList``, the list, and the
modules after it. The model's ``forward`` must apply them in that order (the
chain test of a split checks exactly that for the model at hand).
"""

from __future__ import annotations

from torch import nn

from pipeforge.errors import UsageError


def list_parts(model: nn.Module) -> tuple[list[tuple[str, nn.Module]], list[tuple[str, nn.Module]],
                                          list[tuple[str, nn.Module]]]:
    if isinstance(model, nn.Sequential):
        return [], list(model.named_children()), []
    children = list(model.named_children())
    lists = [(i, name, child) for i, (name, child) in enumerate(children) if isinstance(child, nn.ModuleList)]
    if len(lists) != 1:
        raise UsageError(f"pipeforge.split: {type(model).__name__} is neither a Hugging Face causal LM, an "
                         f"nn.Sequential, nor a module with one nn.ModuleList of layers (it has {len(lists)})")
    index, name, layers = lists[0]
    return children[:index], [(f"{name}.{i}", layer) for i, layer in enumerate(layers)], children[index + 1:]


class LayerListStage(nn.Module):
    """Some modules, then layers ``bounds`` of the list, then some modules, applied in order; names kept."""

    def __init__(self, before: list[tuple[str, nn.Module]], layers: list[tuple[str, nn.Module]], bounds: range,
                 after: list[tuple[str, nn.Module]]) -> None:
        super().__init__()
        self.order: list[str] = []
        for name, module in [*before, *(layers[i] for i in bounds), *after]:
            self._add(name, module)

    def _add(self, name: str, module: nn.Module) -> None:
        head, _, tail = name.partition(".")
        if not tail:
            self.add_module(head, module)
            self.order.append(head)
            return
        holder = self._modules.get(head)
        if holder is None:
            holder = nn.ModuleDict()
            self.add_module(head, holder)
        assert isinstance(holder, nn.ModuleDict), "a dotted name's head is a list's name: the ModuleDict made here"
        holder[tail] = module
        self.order.append(name)

    def forward(self, x: object) -> object:  # (whatever the modules take and give)
        for name in self.order:
            x = self.get_submodule(name)(x)
        return x
