"""Stage modules whose outputs take every form a stage may return, and the worker that runs them.

A case is a list, per stage but the last, of the items the stage returns (a
tuple in that order); the last stage returns one tensor. Items:

- ``h``: the stage's hidden state (a float tensor with a graph); ``h2``: a second one;
- ``same``: the very ``h`` object again (``return h, h``); ``view``: a view of ``h``;
- ``input``: the stage's first input itself; ``input_view``: a view of it;
- ``param``: one of the stage's parameters (an output aliasing a parameter);
- ``nograd``: a float tensor that does not require grad; ``int``: an int64 tensor; ``bool``: a bool tensor.

Every stage consumes every item it receives (float items weighted by a parameter
of its own, integer and boolean ones as floats), so every gradient path counts.
``run_cases`` builds a pipeline per case on the group, trains two steps in
float64, and reports the largest difference from the same modules run without
pipelining, or the error a rank raised (the refusal the case got).
"""

from __future__ import annotations

import copy

import torch

from pipeforge.tools.generated import load_module

WIDTH = 3


class OutputStage(torch.nn.Module):
    def __init__(self, arity: int, items: tuple[str, ...] | None, seed: int):
        super().__init__()
        generator = torch.Generator().manual_seed(seed)
        self.items = items  # None: the last stage (one tensor out)
        self.linear = torch.nn.Linear(WIDTH, WIDTH).double()
        with torch.no_grad():
            self.linear.weight.copy_(torch.randn(WIDTH, WIDTH, generator=generator, dtype=torch.float64) * 0.5)
            self.linear.bias.copy_(torch.randn(WIDTH, generator=generator, dtype=torch.float64) * 0.1)
        self.mix = torch.nn.Parameter(torch.randn(max(arity, 1), generator=generator, dtype=torch.float64))
        self.scale = torch.nn.Parameter(torch.randn(WIDTH, generator=generator, dtype=torch.float64))

    def forward(self, *inputs):
        total = 0
        for index, value in enumerate(inputs):
            total = total + self.mix[index] * (value if value.is_floating_point() else value.double())
        h = torch.tanh(self.linear(total))
        if self.items is None:
            return h
        out = []
        for item in self.items:
            out.append(self._item(item, h, inputs[0]))
        return tuple(out)

    def _item(self, item: str, h: torch.Tensor, first: torch.Tensor) -> torch.Tensor:
        if item in ("h", "same"):
            return h
        if item == "h2":
            return h * self.scale
        if item == "view":
            return h[:, :WIDTH]
        if item == "input":
            return first
        if item == "input_view":
            return first[..., :WIDTH]
        if item == "param":
            return self.scale
        if item == "nograd":
            return h.detach() * 2
        if item == "int":
            return (h.detach() > 0).long() + 1
        if item == "bool":
            return h.detach() > 0
        raise ValueError(item)


def build_stages(case: list[tuple[str, ...]], seed: int) -> list[torch.nn.Module]:
    """One module per stage: ``case[s]`` the items stage s returns, the last stage one tensor."""
    stages, arity = [], 1
    for stage, items in enumerate([*case, None]):
        stages.append(OutputStage(arity, tuple(items) if items is not None else None, seed + stage))
        arity = len(items) if items is not None else 0
    return stages


def loss_fn(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return ((output - target) ** 2).mean()


def unpipelined(stages: list[torch.nn.Module], x: torch.Tensor, y: torch.Tensor, microbatches: int) -> None:
    for xm, ym in zip(torch.tensor_split(x, microbatches), torch.tensor_split(y, microbatches)):
        value = (xm,)
        for module in stages:
            value = module(*value)
            value = value if isinstance(value, tuple) else (value,)
        loss_fn(value[0], ym).backward()
    for module in stages:
        for param in module.parameters():
            if param.grad is not None:
                param.grad.div_(microbatches)


def run_case(rank: int, path: str, case: list[tuple[str, ...]], seed: int, timeout: float) -> dict:
    generated = load_module(path)
    info = generated.SCHEDULE
    full = build_stages(case, seed)
    reference = [copy.deepcopy(m) for m in full]
    mine = {s: copy.deepcopy(full[s]) for s in info.stages_of(rank)}
    try:
        pipe = generated.make_pipeline(mine, loss_fn=loss_fn, timeout=timeout)
    except Exception as error:  # noqa: BLE001 (the refusal is what the test looks at)
        return {"refused": f"{type(error).__name__}: {error}"}
    worst = 0.0
    for step in range(2):
        generator = torch.Generator().manual_seed(seed * 10 + step)
        x = torch.randn(2 * info.microbatches, WIDTH, generator=generator, dtype=torch.float64)
        y = torch.randn(2 * info.microbatches, WIDTH, generator=generator, dtype=torch.float64)
        try:
            pipe.step(*((x,) if pipe.holds_first else ()), target=y if pipe.holds_last else None)
        except Exception as error:  # noqa: BLE001
            return {"refused": f"{type(error).__name__}: {error}", "step": step}
        unpipelined(reference, x, y, info.microbatches)
        for stage, module in mine.items():
            for got, want in zip(module.parameters(), reference[stage].parameters()):
                got_grad = got.grad if got.grad is not None else torch.zeros_like(got)
                want_grad = want.grad if want.grad is not None else torch.zeros_like(want)
                worst = max(worst, (got_grad - want_grad).abs().max().item())
                got.grad, want.grad = None, None
    return {"max_abs_diff": worst}


def run_cases(rank: int, nproc: int, payload: tuple) -> list[dict]:
    """``payload``: (timeout, [(module path, case, seed), ...]); one report per case."""
    timeout, cases = payload
    return [run_case(rank, path, case, seed, timeout) for path, case, seed in cases]


ITEMS = ("h", "h2", "same", "view", "input", "input_view", "param", "nograd", "int", "bool")
