"""The check behind ``pipeforge run``: a generated pipeline against the same model unpipelined.

Every rank builds the whole float64 model from one seed, keeps the stages it
runs for the pipeline, and also runs the unpipelined model (all stages in one
process, microbatch after microbatch, gradients accumulated and divided by the
microbatch count, as torch's ``schedule.step`` defines them). After each of
``steps`` SGD steps it compares losses, merged outputs and every parameter's
gradient of its stages, then the parameters after the steps, and an eval pass.
"""

from __future__ import annotations

import copy
import os
from dataclasses import dataclass, field
from typing import Any

import torch

from pipeforge.runtime.microbatch import merge_chunks, split_value
from pipeforge.tools import demo_models as models
from pipeforge.tools.generated import load_module
from pipeforge.tools.launch import summarize

RELATIVE_TOLERANCE = 1e-5


@dataclass(frozen=True)
class CheckJob:
    module_path: str
    model: str = "mlp"
    steps: int = 2
    rows_per_microbatch: int = 2
    scale_grads: bool = True
    eval: bool = True
    timeout: float = 30.0
    seed: int = 0
    learning_rate: float = 0.1
    device: str | None = None  # "cpu" or "cuda"; None: what the backend implies


@dataclass
class Differences:
    """The largest absolute and relative differences seen, and where."""

    max_abs: float = 0.0
    max_rel: float = 0.0
    worst: str = ""
    compared: int = 0
    missing: list[str] = field(default_factory=list)

    def add(self, what: str, got: Any, want: Any) -> None:
        if got is None or want is None:
            if got is not want:
                self.missing.append(what)
            return
        for index, (g, w) in enumerate(zip(_tensors(got), _tensors(want))):
            self._add_tensor(f"{what}[{index}]" if index else what, g, w)

    def _add_tensor(self, what: str, got: torch.Tensor, want: torch.Tensor) -> None:
        self.compared += 1
        if got.shape != want.shape:
            self.missing.append(f"{what}: shape {list(got.shape)} != {list(want.shape)}")
            return
        diff = (got.detach().double().cpu() - want.detach().double().cpu()).abs().max().item() if got.numel() else 0.0
        scale = max(want.detach().abs().max().item() if want.numel() else 0.0, 1e-12)
        if diff > self.max_abs:
            self.max_abs, self.worst = diff, what
        self.max_rel = max(self.max_rel, diff / scale)

    @property
    def match(self) -> bool:
        return not self.missing and self.max_rel <= RELATIVE_TOLERANCE


def _tensors(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    return [t for item in value for t in _tensors(item)]


def check_rank(rank: int, nproc: int, job: CheckJob, group=None) -> dict:
    """Run ``job`` on this rank (its rank in ``group`` when one is given); returns the differences seen."""
    if group is not None:
        import torch.distributed as dist

        rank = dist.get_rank(group)
    generated = load_module(job.module_path)
    info = generated.SCHEDULE
    full = models.build_stages(job.model, info.stages, job.seed)
    held = sorted({stage for stage, _ in info.held(rank)})
    device = _device(job.device, rank)
    mine = {stage: copy.deepcopy(full[stage]).to(device) for stage in held}
    pipe = generated.make_pipeline(mine, loss_fn=models.loss_fn, group=group, device=device,
                                   scale_grads=job.scale_grads, timeout=job.timeout)
    reference = Reference(full, info.microbatches, job.scale_grads)
    parameters = [p for m in mine.values() for p in m.parameters()]
    diffs = Differences()
    for step in range(job.steps):
        x, y = models.make_batch(info.stages, info.microbatches * job.rows_per_microbatch, job.seed + step)
        losses: list = []
        out = pipe.step(*((x,) if pipe.holds_first else ()), target=y if pipe.holds_last else None, losses=losses)
        want_losses, want_out = reference.step(x, y)
        _compare_results(diffs, f"step {step}", pipe, losses, out, want_losses, want_out)
        for stage, module in mine.items():
            _compare_grads(diffs, f"step {step} stage {stage}", module, reference.stages[stage])
        sgd(parameters, job.learning_rate)
        sgd(reference.parameters(), job.learning_rate)
    for stage, module in mine.items():
        for (name, got), want in zip(module.named_parameters(), reference.stages[stage].parameters()):
            diffs.add(f"parameter {name} of stage {stage} after {job.steps} steps", got, want)
    if job.eval:
        x, y = models.make_batch(info.stages, info.microbatches * job.rows_per_microbatch, job.seed + 1000)
        losses = []
        out = pipe.eval(*((x,) if pipe.holds_first else ()), target=y if pipe.holds_last else None, losses=losses)
        want_losses, want_out = reference.eval(x, y)
        _compare_results(diffs, "eval", pipe, losses, out, want_losses, want_out)
    return {"rank": rank, "max_abs_diff": diffs.max_abs, "max_rel_diff": diffs.max_rel, "worst": diffs.worst,
            "compared": diffs.compared, "missing": diffs.missing[:5], "match": diffs.match}


def _device(name: str | None, rank: int) -> torch.device:
    import torch.distributed as dist

    if "nccl" in str(dist.get_backend()):
        return torch.device("cuda", torch.cuda.current_device())
    if name == "cuda":  # gloo with CUDA tensors: ranks may share a GPU
        return torch.device("cuda", rank % torch.cuda.device_count())
    return torch.device("cpu")


def _compare_results(diffs: Differences, what: str, pipe, losses: list, out: Any, want_losses, want_out) -> None:
    if not pipe.holds_last:
        return
    done = [mb for mb, loss in enumerate(losses) if loss is not None]
    if not done:
        diffs.missing.append(f"{what}: no losses on the rank holding the last stage")
    for mb in done:
        diffs.add(f"{what} loss of microbatch {mb}", losses[mb], want_losses[mb])
    diffs.add(f"{what} outputs", out, merge_chunks([want_out[mb] for mb in done]))


def _compare_grads(diffs: Differences, what: str, module: torch.nn.Module, want: torch.nn.Module) -> None:
    for (name, got), expected in zip(module.named_parameters(), want.parameters()):
        diffs.add(f"{what} grad of {name}", got.grad, expected.grad)


class Reference:
    """The unpipelined model: microbatches in order, gradients accumulated, then scaled."""

    def __init__(self, stages: list[torch.nn.Module], microbatches: int, scale_grads: bool):
        self.stages = [copy.deepcopy(s) for s in stages]
        self.microbatches = microbatches
        self.scale_grads = scale_grads

    def step(self, x: torch.Tensor, y: torch.Tensor) -> tuple[list, list]:
        losses, outputs = [], []
        for xm, ym in zip(split_value(x, self.microbatches), split_value(y, self.microbatches)):
            out = models.run_stages(self.stages, xm)
            loss = models.loss_fn(out, ym)
            loss.backward()
            losses.append(loss.detach())
            outputs.append(out.detach())
        if self.scale_grads:
            for p in self.parameters():
                if p.grad is not None:
                    p.grad.div_(self.microbatches)
        return losses, outputs

    def eval(self, x: torch.Tensor, y: torch.Tensor) -> tuple[list, list]:
        with torch.no_grad():
            outs = [models.run_stages(self.stages, xm) for xm in split_value(x, self.microbatches)]
            losses = [models.loss_fn(o, ym) for o, ym in zip(outs, split_value(y, self.microbatches))]
        return losses, outs

    def parameters(self) -> list[torch.nn.Parameter]:
        return [p for s in self.stages for p in s.parameters()]


def sgd(parameters: list[torch.nn.Parameter], learning_rate: float) -> None:
    """Plain SGD, then clear the gradients (torch.optim would import torch._dynamo: seconds per process)."""
    with torch.no_grad():
        for param in parameters:
            if param.grad is not None:
                param.sub_(param.grad, alpha=learning_rate)
            param.grad = None


def check_job_fields(rank: int, nproc: int, fields: dict) -> dict:
    """One job given as a dict of ``CheckJob`` fields (the parent need not import torch to build it)."""
    return check_rank(rank, nproc, CheckJob(**fields))


def run_check_from_environment(module_path: str, *, steps: int = 2, model: str = "mlp", backend: str = "gloo",
                               timeout: float = 300.0, device: str | None = None) -> dict | None:
    """Under torchrun (RANK, WORLD_SIZE, MASTER_ADDR set): check, then gather; rank 0 gets the verdict."""
    from datetime import timedelta

    import torch.distributed as dist

    from pipeforge.runtime.objects import all_gather_objects

    dist.init_process_group(backend, timeout=timedelta(seconds=timeout))
    try:
        if backend == "nccl":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
        job = CheckJob(module_path, model=model, steps=steps, timeout=timeout, device=device)
        report = check_rank(dist.get_rank(), dist.get_world_size(), job)
        gathered_on = torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" else torch.device("cpu")
        reports = all_gather_objects(report, device=gathered_on)
        return summarize(reports) if dist.get_rank() == 0 else None
    finally:
        dist.destroy_process_group()
