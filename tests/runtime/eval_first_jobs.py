"""The job of the eval()-first tests: validate, then train (run in spawned gloo processes)."""

from __future__ import annotations

import copy

import torch

ROWS, WIDTH, MICROBATCHES, STEPS, LR = 8, 4, 4, 3, 0.1


class Head(torch.nn.Module):
    """A linear layer, sending on a table made without a gradient (as rotary tables ride along)."""

    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(WIDTH, WIDTH)
        self.register_buffer("scale", torch.tensor(0.5))

    def forward(self, x):
        h = self.linear(x)
        return h, torch.ones_like(h.detach()) * self.scale


class Middle(torch.nn.Module):
    """A layer that clamps the table in place (a tensor made without a gradient, so its own to change, as in
    the unpipelined model), adds it and passes it on."""

    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(WIDTH, WIDTH)
        self.seen: list[bool] = []  # whether the table wanted a gradient, per forward

    def forward(self, h, table):
        self.seen.append(table.requires_grad)
        table = table.clamp_(min=0.0)
        return torch.tanh(self.linear(h)) + table, table


class Tail(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(WIDTH, WIDTH)
        self.seen: list[bool] = []

    def forward(self, h, table):
        self.seen.append(table.requires_grad)
        return torch.tanh(self.linear(h)) * table


def loss_fn(output, target):
    return torch.nn.functional.mse_loss(output, target)


def build(stages: int) -> list[torch.nn.Module]:
    torch.manual_seed(0)
    return [Head(), *[Middle() for _ in range(stages - 2)], Tail()]


def run_all(modules, x):
    out = modules[0](x)
    for module in modules[1:]:
        out = module(*out)
    return out


def validate_then_train(rank: int, nproc: int, job: dict) -> dict:
    """One eval() (the validation loss), then ``STEPS`` SGD steps; the same on the unpipelined model. What each
    call raised ('' where it returned), the worst difference of the losses and of the parameters after each
    step, and whether the table input of this rank's stages wanted a gradient in the steps' forwards."""
    from pipeforge.runtime import PipelineError
    from pipeforge.tools.generated import load_module

    torch.set_default_dtype(torch.float64)
    generated = load_module(job["path"])
    full = build(generated.SCHEDULE.stages)
    reference = copy.deepcopy(full)
    mine = {stage: full[stage] for stage in generated.SCHEDULE.stages_of(rank)}
    pipe = generated.make_pipeline(mine, loss_fn=loss_fn, timeout=job["wait"])
    pipe.preflight = job.get("preflight", True)
    generator = torch.Generator().manual_seed(1)
    x, y = torch.randn(ROWS, WIDTH, generator=generator), torch.randn(ROWS, WIDTH, generator=generator)
    batch, target = ((x,) if pipe.holds_first else ()), (y if pipe.holds_last else None)
    report: dict = {"errors": [], "diffs": [], "eval_diff": None}
    chunks = list(zip(x.tensor_split(MICROBATCHES), y.tensor_split(MICROBATCHES)))
    losses: list = []
    try:
        pipe.eval(*batch, target=target, losses=losses)
        report["errors"].append("")
    except PipelineError as error:
        report["errors"].append(str(error))
    if pipe.holds_last and losses:
        with torch.no_grad():
            expected = [loss_fn(run_all(reference, xm), ym) for xm, ym in chunks]
        report["eval_diff"] = max(abs(a.item() - b.item()) for a, b in zip(losses, expected))
    for module in mine.values():
        if hasattr(module, "seen"):
            module.seen.clear()
    for _ in range(STEPS):
        for module in mine.values():
            module.zero_grad(set_to_none=True)
        try:
            pipe.step(*batch, target=target)
            report["errors"].append("")
        except PipelineError as error:
            report["errors"].append(str(error))
            continue
        for module in reference:
            module.zero_grad(set_to_none=True)
        (sum(loss_fn(run_all(reference, xm), ym) for xm, ym in chunks) / MICROBATCHES).backward()
        with torch.no_grad():
            for module in (*mine.values(), *reference):
                for param in module.parameters():
                    param -= LR * param.grad
        report["diffs"].append(max((a - b).abs().max().item() for stage, module in mine.items()
                                   for a, b in zip(module.parameters(), reference[stage].parameters())))
    report["seen"] = [seen for module in mine.values() for seen in getattr(module, "seen", [])]
    return report
