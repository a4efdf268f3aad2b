"""Run zoo models through pipeforge's runtime (or torch's) on every rank and compare with the unpipelined model.

One spawned process group runs many cases in a row (``run_cases``), so a test
pays for one launch, not one per (schedule, model). Each rank reports, per
case, the largest absolute and relative differences of the losses, the merged
outputs, every gradient after each step and every parameter after the SGD
steps, against the same model run unpipelined in the same process.
"""

from __future__ import annotations

import contextlib
import copy
import math
from collections.abc import Iterable
from dataclasses import dataclass, field

import torch

from tests.zoo import models as zoo

# pipeforge library schedule -> torch's class for it (torch.distributed.pipelining.schedules)
TORCH_SCHEDULES = {
    "gpipe": "ScheduleGPipe", "1f1b": "Schedule1F1B", "interleaved-1f1b": "ScheduleInterleaved1F1B",
    "looped-bfs": "ScheduleLoopedBFS", "interleaved-zb": "ScheduleInterleavedZeroBubble",
    "zbv": "ScheduleZBVZeroBubble", "dualpipev": "ScheduleDualPipeV",
}


@dataclass(frozen=True)
class Case:
    label: str
    model: str
    module_path: str  # a generated pipeforge module (its SCHEDULE gives stages, microbatches, placements)
    runtime: str = "pipeforge"  # or "torch": the same schedule by torch's class
    torch_schedule: str = ""
    every_stage: bool = True  # give the model's mask / positions to every stage (pipeforge only)
    steps: int = 2
    rows_per_microbatch: int = 2
    rng_seed: int | None = None  # make_pipeline(rng_seed=...), and the reference under microbatch_rng


@dataclass
class Report:
    label: str
    rank: int
    max_abs: float = 0.0
    max_rel: float = 0.0
    worst: str = ""
    compared: int = 0
    missing: list[str] = field(default_factory=list)
    grads: dict[str, list[float]] = field(default_factory=dict)  # name -> flattened gradient (first step)

    def add(self, what: str, got, want) -> None:
        if got is None or want is None:
            if (got is None) != (want is None):
                self.missing.append(what)
            return
        self.compared += 1
        diff = (got.detach().double() - want.detach().double()).abs().max().item() if got.numel() else 0.0
        diff = math.inf if math.isnan(diff) else diff  # a NaN compares false with everything: count it as off
        scale = max(want.detach().double().abs().max().item() if want.numel() else 0.0, 1e-12)
        if diff > self.max_abs:
            self.max_abs, self.worst = diff, what
        self.max_rel = max(self.max_rel, diff / scale)

    def as_dict(self) -> dict:
        return {"label": self.label, "rank": self.rank, "max_abs": self.max_abs, "max_rel": self.max_rel,
                "worst": self.worst, "compared": self.compared, "missing": self.missing[:5], "grads": self.grads}


@dataclass
class Expected:
    """What the unpipelined model gives, step by step (computed once per model and shape, then reused)."""

    losses: list[list[torch.Tensor]] = field(default_factory=list)  # per step, per microbatch
    outputs: list[list[torch.Tensor]] = field(default_factory=list)
    grads: list[dict[tuple[int, str], torch.Tensor | None]] = field(default_factory=list)  # per step
    params: dict[tuple[int, str], torch.Tensor] = field(default_factory=dict)  # after the steps


_EXPECTED: dict[tuple, Expected] = {}


def expected(model: str, stages: int, microbatches: int, case: Case) -> Expected:
    key = (model, stages, microbatches, case.every_stage, case.steps, case.rows_per_microbatch, case.rng_seed)
    if key not in _EXPECTED:
        _EXPECTED[key] = unpipelined(model, stages, microbatches, case)
    return _EXPECTED[key]


def unpipelined(model: str, stages: int, microbatches: int, case: Case) -> Expected:
    """The whole model in one process: microbatches in order, gradients accumulated, then divided by M.
    With ``case.rng_seed`` each stage's forward (the last one's with its loss) runs under
    ``microbatch_rng(seed, step, stage, microbatch)``, as the pipeline seeds it (docs/runtime.md)."""
    modules = zoo.build(model, stages, seed=0)
    result = Expected()
    for step in range(case.steps):
        tokens, targets, every_stage = inputs(case, microbatches, step)
        losses, outputs = [], []
        for m in range(microbatches):
            value = tokens.tensor_split(microbatches)[m]
            for s, module in enumerate(modules):
                with seeded(case.rng_seed, step, s, m):
                    value = module(value, **{k: v.tensor_split(microbatches)[m] for k, v in every_stage.items()})
                    if s == len(modules) - 1:
                        loss = zoo.loss_fn(value, targets.tensor_split(microbatches)[m])
            loss.backward()
            losses.append(loss.detach())
            outputs.append(value.detach())
        for param in parameters(modules):
            if param.grad is not None:
                param.grad.div_(microbatches)
        result.losses.append(losses)
        result.outputs.append(outputs)
        result.grads.append({(s, name): None if p.grad is None else p.grad.clone()
                             for s, module in enumerate(modules) for name, p in module.named_parameters()})
        sgd(parameters(modules))
    result.params = {(s, name): p.detach().clone() for s, module in enumerate(modules)
                     for name, p in module.named_parameters()}
    return result


def seeded(seed: int | None, step: int, stage: int, microbatch: int):
    from pipeforge.runtime import microbatch_rng

    return microbatch_rng(seed, step, stage, microbatch) if seed is not None else contextlib.nullcontext()


def inputs(case: Case, microbatches: int, step: int) -> tuple:
    tokens, targets, every_stage = zoo.batch(case.model, microbatches * case.rows_per_microbatch, step)
    return tokens, targets, (every_stage if case.every_stage else {})


def parameters(modules) -> list[torch.nn.Parameter]:
    return list({id(p): p for m in modules for p in m.parameters()}.values())


def sgd(params: Iterable[torch.nn.Parameter], rate: float = 0.1) -> None:
    with torch.no_grad():
        for param in params:
            if param.grad is not None:
                param.sub_(param.grad, alpha=rate)
            param.grad = None


def run_cases(rank: int, nproc: int, cases: list[Case]) -> list[dict]:
    """A spawn worker: every case in order on this rank."""
    return [run_case(rank, case).as_dict() for case in cases]


def run_case(rank: int, case: Case) -> Report:
    from pipeforge.tools.generated import load_module

    info = load_module(case.module_path).SCHEDULE
    want = expected(case.model, info.stages, info.microbatches, case)
    full = zoo.build(case.model, info.stages, seed=0)
    # a bidirectional schedule refuses stages that share a parameter (each stage's gradients are summed
    # across chains): there every stage is its own copy, and the tie goes through tied_parameters alone
    if len(info.placements) > 1:
        full = [copy.deepcopy(s) for s in full]
    held = sorted({s for s, _ in info.held(rank)})
    mine = {s: full[s] for s in held}
    runner = PipeforgeRunner(case, info, mine) if case.runtime == "pipeforge" else TorchRunner(case, info, mine)
    report = Report(case.label, rank)
    last = info.stages - 1 in held
    for step in range(case.steps):
        losses, out = runner.step(*inputs(case, info.microbatches, step))
        if last:  # a bidirectional schedule finishes some microbatches on the other chain's last rank
            done = [m for m, loss in enumerate(losses) if loss is not None]
            if len(losses) != info.microbatches or not done:
                report.missing.append(f"step {step}: losses {losses!r}")
            for m in done:
                report.add(f"step {step} loss {m}", losses[m], want.losses[step][m])
            report.add(f"step {step} outputs", out, torch.cat([want.outputs[step][m] for m in done]))
        for stage in held:
            for name, got in mine[stage].named_parameters():
                report.add(f"step {step} grad of stage {stage} {name}", got.grad, want.grads[step][(stage, name)])
                if step == 0 and got.grad is not None:
                    report.grads[f"{stage}:{name}"] = got.grad.flatten().tolist()
        sgd(parameters(mine.values()))
    for stage in held:
        for name, got in mine[stage].named_parameters():
            report.add(f"parameter of stage {stage} {name} after {case.steps} steps", got, want.params[(stage, name)])
    return report


class PipeforgeRunner:
    def __init__(self, case: Case, info, mine: dict):
        from pipeforge.tools.generated import load_module

        generated = load_module(case.module_path)
        tied = zoo.tied_parameters(case.model, info.stages)
        self.pipe = generated.make_pipeline(mine, loss_fn=zoo.loss_fn, timeout=30, tied_parameters=tied,
                                            rng_seed=case.rng_seed)

    def step(self, tokens, targets, every_stage: dict):
        losses = ["left from an earlier step"]
        out = self.pipe.step(*((tokens,) if self.pipe.holds_first else ()),
                             target=targets if self.pipe.holds_last else None, losses=losses,
                             shared_kwargs=every_stage)
        return losses, out


class TorchRunner:
    """torch.distributed.pipelining's schedule of the same name, on the same stage modules."""

    SINGLE_STAGE = ("ScheduleGPipe", "Schedule1F1B")  # these take one stage, the others a list

    def __init__(self, case: Case, info, mine: dict):
        from torch.distributed import pipelining

        stages = [pipelining.PipelineStage(module, s, info.stages, torch.device("cpu")) for s, module in
                  sorted(mine.items())]
        schedule = getattr(pipelining, case.torch_schedule)
        single = case.torch_schedule in self.SINGLE_STAGE
        self.schedule = schedule(stages[0] if single else stages, n_microbatches=info.microbatches,
                                 loss_fn=zoo.loss_fn)
        self.first = 0 in mine
        self.last = info.stages - 1 in mine

    def step(self, tokens, targets, every_stage: dict):
        losses: list = []
        out = self.schedule.step(*((tokens,) if self.first else ()), target=targets if self.last else None,
                                 losses=losses if self.last else None)
        return [loss.detach() for loss in losses], out
