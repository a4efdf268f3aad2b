"""Workers for the split + pipeline tests: each rank splits a meta model, trains it, compares with the model.

Every rank builds the model on the meta device and lets ``pipeforge.split``
materialize only the stages it runs (given the schedule, which unties a
tied weight on a bidirectional one), then trains it with ``make_pipeline(cut.modules, tied_parameters=
cut.tied_parameters, loss_fn=TokenMeanLoss(), scale_grads=False)`` on padded
batches (the attention mask given to every stage). The reference is the whole
model, materialized from the same seed, trained unpipelined in the same process:
microbatch after microbatch, each the sum of its token losses over the batch's
valid tokens plus (MoE) the router's balancing loss of every layer, from the
model's own ``router_logits``. Each rank reports the largest relative
difference of the losses, every gradient after each step and every parameter
after two SGD steps.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

import pipeforge
from pipeforge.models import TokenMeanLoss
from pipeforge.tools.generated import load_module
from tests.models import families
from tests.zoo.harness import Report, sgd  # the largest differences, by name; the SGD every reference uses

SEED = 5


@dataclass(frozen=True)
class Case:
    label: str
    family: str
    module_path: str
    steps: int = 2
    rows_per_microbatch: int = 2


def layers_for(stages: int) -> int:
    return max(families.LAYERS, stages)


def run_cases(rank: int, nproc: int, cases: list[Case]) -> list[dict]:
    torch.set_num_threads(1)
    return [vars(run_case(rank, case)) for case in cases]


def run_case(rank: int, case: Case) -> Report:
    generated = load_module(case.module_path)
    info = generated.SCHEDULE
    layers = layers_for(info.stages)
    cut = pipeforge.split(families.build(case.family, meta=True, layers=layers), info,  # untied on two chains
                          owned=generated.stages_of_rank(rank), seed=SEED)
    loss_fn = TokenMeanLoss()
    pipe = generated.make_pipeline(cut.modules, loss_fn=loss_fn, tied_parameters=cut.tied_parameters,
                                   scale_grads=False, timeout=60)
    reference = Reference(case.family, info.stages, info.microbatches, layers)
    report = Report(case.label, rank)
    for step in range(case.steps):
        tokens, mask, target = families.batch(case.family, info.microbatches * case.rows_per_microbatch, step)
        every = {"attention_mask": mask} if families.takes_mask(case.family) else None
        losses: list = []
        pipe.step(*((tokens,) if pipe.holds_first else ()), target=loss_fn.batch(target) if pipe.holds_last else None,
                  losses=losses, shared_kwargs=every)
        want_losses, want_grads = reference.step(tokens, mask, target)
        for m, loss in enumerate(losses):
            if loss is not None:
                report.add(f"step {step} loss {m}", loss, want_losses[m])
        if pipe.holds_last and not any(loss is not None for loss in losses):
            report.missing.append(f"step {step}: no losses")
        for stage, module in cut.modules.items():
            for name, param in module.named_parameters():
                want = want_grads[cut.names[(stage, name)]]
                report.add(f"step {step} grad of stage {stage} {name}", param.grad, want)
        sgd(pipe.parameters())
    for stage, module in cut.modules.items():
        for name, param in module.named_parameters():
            want = reference.params[cut.names[(stage, name)]]
            report.add(f"stage {stage} {name} after {case.steps} steps", param, want)
    return report


class Reference:
    """The whole model, materialized by split from the same seed, trained unpipelined."""

    def __init__(self, family: str, stages: int, microbatches: int, layers: int):
        self.family, self.microbatches = family, microbatches
        self.model = families.build(family, meta=True, layers=layers)
        pipeforge.split(self.model, stages, seed=SEED)  # materializes every part of the model itself
        assert not any(p.is_meta for p in self.model.parameters())

    @property
    def params(self) -> dict[str, torch.Tensor]:
        return dict(self.model.named_parameters(remove_duplicate=False))

    def step(self, tokens, mask, target):
        count = (target != -100).sum()
        losses = []
        for m in range(self.microbatches):
            x, attention, y = (t.tensor_split(self.microbatches)[m] for t in (tokens, mask, target))
            logits, aux = self._forward(x, attention)
            loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), y.reshape(-1), reduction="sum") / count
            (loss + aux).backward()
            losses.append(loss.detach())
        grads = {name: p.grad.clone() if p.grad is not None else None
                 for name, p in self.model.named_parameters(remove_duplicate=False)}
        sgd(list(self.model.parameters()))
        return losses, grads

    def _forward(self, x, attention):
        if not families.takes_mask(self.family):
            return self.model(x), 0.0
        moe = self.family in families.MOE
        out = self.model(input_ids=x, attention_mask=attention, output_router_logits=moe, use_cache=False)
        if not moe:
            return out.logits, 0.0
        import sys

        config = self.model.config
        balance = sys.modules[type(self.model).__module__].load_balancing_loss_func
        experts = getattr(config, "num_local_experts", None) or config.num_experts
        aux = sum(balance((layer,), experts, config.num_experts_per_tok, attention) for layer in out.router_logits)
        return out.logits, config.router_aux_loss_coef * aux


def optimizer_warnings(rank: int, nproc: int, module_path: str) -> dict:
    """Warnings from an optimizer built from the stage modules, and from one built from pipe.parameters()."""
    import warnings

    from pipeforge.runtime.optimizer_watch import PipelineWarning

    generated = load_module(module_path)
    cut = pipeforge.split(families.build("llama-tied", meta=True), generated.SCHEDULE.stages,
                          owned=generated.stages_of_rank(rank), seed=SEED)
    pipe = generated.make_pipeline(cut.modules, loss_fn=TokenMeanLoss(), tied_parameters=cut.tied_parameters)
    found = {}
    for label, params in (("stage modules", [p for m in cut.modules.values() for p in m.parameters()]),
                          ("pipe.parameters()", pipe.parameters())):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            optimizer = torch.optim.SGD(params, lr=0.1)
            optimizer.step()
            optimizer.step()  # checked once per optimizer
        found[label] = [str(w.message) for w in caught if issubclass(w.category, PipelineWarning)]
    return found
