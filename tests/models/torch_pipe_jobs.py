"""Workers for the torch ``pipeline()`` tests: one split run three ways on each rank, then compared.

Every rank builds the same float64 model, traces it with torch's ``pipeline()``
at the schedule's stage count (a microbatch's shape), and trains it for two SGD
steps three ways: through ``pipeforge.split(pipe, SCHEDULE, owned=...)`` and the
generated module; through torch's own runtime on a second trace of the same
model (``pipe.build_stage`` and the torch schedule class named by the case,
torch's replicated parameters all-reduced by hand, as torch leaves that to the
user); and unpipelined (microbatch after microbatch, each loss divided by their
number, as ``scale_grads`` does). Each rank reports the largest relative
difference of the losses, of every gradient of its stages after each step and
of every parameter after the steps, and of ``eval``'s merged outputs then,
against torch's runtime and against the unpipelined model.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

import pipeforge
from pipeforge.tools.generated import load_module
from tests.zoo.harness import Report, sgd

VOCAB, SEQ, WIDTH, LAYERS, ROWS = 40, 6, 16, 4, 2


@dataclass(frozen=True)
class Case:
    label: str
    family: str  # "gpt2", "gpt2-eager", "tiny-llama" (hand-written, rotary tables and mask made once), "long-skip",
    # "late-input"
    module_path: str
    torch_schedule: str | None  # torch's schedule class to compare with, or None (torch cannot run the split)
    steps: int = 2


class Reports:
    """The two comparisons of one case on one rank, each a zoo harness ``Report``."""

    def __init__(self, label: str, rank: int):
        self.of = {against: Report(label, rank) for against in ("torch", "unpipelined")}

    def add(self, against: str, what: str, got, want) -> None:
        self.of[against].add(what, got, want)

    def missing(self, what: str) -> None:
        self.of["unpipelined"].missing.append(what)

    def as_dict(self) -> dict:
        return {against: report.as_dict() for against, report in self.of.items()}


class TinyLlama(nn.Module):
    """A Llama written by hand: rotary (cos, sin) and the causal mask computed once in ``forward``,
    RMSNorm, rotary attention, SwiGLU; every block takes the tables and the mask (skip edges of a split)."""

    def __init__(self, layers: int = LAYERS, heads: int = 2):
        super().__init__()
        self.heads = heads
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.layers = nn.ModuleList(LlamaBlock(WIDTH, heads) for _ in range(layers))
        self.norm = nn.RMSNorm(WIDTH)
        self.head = nn.Linear(WIDTH, VOCAB, bias=False)
        half = WIDTH // heads // 2
        self.register_buffer("inv_freq", 1.0 / 10000 ** (torch.arange(half, dtype=torch.float64) / half))

    def forward(self, tokens):
        h = self.embed(tokens)
        positions = torch.arange(tokens.shape[1], dtype=torch.float64)
        angles = torch.outer(positions, self.inv_freq)
        cos, sin = angles.cos(), angles.sin()
        mask = torch.ones(tokens.shape[1], tokens.shape[1], dtype=torch.bool).tril()
        for layer in self.layers:
            h = layer(h, cos, sin, mask)
        return self.head(self.norm(h))


class LlamaBlock(nn.Module):
    def __init__(self, width: int, heads: int):
        super().__init__()
        self.heads = heads
        self.attn_norm, self.mlp_norm = nn.RMSNorm(width), nn.RMSNorm(width)
        self.qkv = nn.Linear(width, 3 * width, bias=False)
        self.out = nn.Linear(width, width, bias=False)
        self.gate, self.up = nn.Linear(width, 2 * width, bias=False), nn.Linear(width, 2 * width, bias=False)
        self.down = nn.Linear(2 * width, width, bias=False)

    def forward(self, h, cos, sin, mask):
        rows, seq, width = h.shape
        q, k, v = self.qkv(self.attn_norm(h)).view(rows, seq, 3, self.heads, -1).transpose(1, 3).unbind(2)
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        h = h + self.out(a.transpose(1, 2).reshape(rows, seq, width))
        x = self.mlp_norm(h)
        return h + self.down(F.silu(self.gate(x)) * self.up(x))


def rotate(x, cos, sin):
    first, second = x.chunk(2, dim=-1)
    return torch.cat([first * cos - second * sin, second * cos + first * sin], dim=-1)


class LongSkip(nn.Module):
    """Blocks whose head also reads the embedding: a value with a gradient that skips every middle stage."""

    def __init__(self, layers: int = LAYERS):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.layers = nn.ModuleList(nn.Sequential(nn.LayerNorm(WIDTH), nn.Linear(WIDTH, WIDTH), nn.Tanh())
                                    for _ in range(layers))
        self.head = nn.Linear(WIDTH, VOCAB)

    def forward(self, tokens):
        first = h = self.embed(tokens)
        for layer in self.layers:
            h = layer(h)
        return self.head(h + first)


class LateInput(LongSkip):
    """A model input only the last stage reads (it rides from stage 0, which takes every input)."""

    def forward(self, tokens, scale):
        h = self.embed(tokens)
        for layer in self.layers:
            h = layer(h)
        return self.head(h * scale)


def build(family: str, seed: int = 0, layers: int = LAYERS) -> nn.Module:
    torch.manual_seed(seed)
    if family in ("gpt2", "gpt2-eager"):
        from transformers import GPT2Config, GPT2LMHeadModel

        # sdpa (the default) takes a boolean mask; eager an additive float one, which torch's runtime cannot
        # send to more than one stage ("Backward of skip connections not supported yet")
        config = GPT2Config(vocab_size=VOCAB, n_embd=WIDTH, n_layer=layers, n_head=4, n_positions=4 * SEQ,
                            resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                            attn_implementation="eager" if family == "gpt2-eager" else "sdpa",
                            bos_token_id=0, eos_token_id=0, use_cache=False)
        model = GPT2LMHeadModel(config)
    else:
        model = {"tiny-llama": TinyLlama, "long-skip": LongSkip, "late-input": LateInput}[family](layers)
    return model.to(torch.float64).train()


def layer_prefix(family: str) -> str:
    return "transformer.h" if family.startswith("gpt2") else "layers"


def torch_pipe(model: nn.Module, family: str, stages: int):
    """torch's ``pipeline()`` split of ``model`` into ``stages`` at layer boundaries, traced on a microbatch."""
    from torch.distributed.pipelining import SplitPoint, pipeline

    layers = len(model.get_submodule(layer_prefix(family)))
    spec = {f"{layer_prefix(family)}.{layers * s // stages}": SplitPoint.BEGINNING for s in range(1, stages)}
    tokens, extra, _ = batch(family, 1, 0)
    return pipeline(model, (tokens,), extra, split_spec=spec)


def batch(family: str, microbatches: int, step: int):
    """Token ids, the model's other inputs by name, and next-token targets, for ``microbatches`` of ROWS rows."""
    generator = torch.Generator().manual_seed(100 + step)
    tokens = torch.randint(0, VOCAB, (microbatches * ROWS, SEQ), generator=generator)
    extra = {"scale": torch.rand(microbatches * ROWS, SEQ, 1, generator=generator, dtype=torch.float64)} \
        if family == "late-input" else {}
    return tokens, extra, torch.roll(tokens, -1, dims=1)


def loss_fn(logits, target):
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), target.reshape(-1))


def run_cases(rank: int, nproc: int, cases: list[Case]) -> list[dict]:
    torch.set_num_threads(1)
    return [run_case(rank, nproc, case).as_dict() for case in cases]


def run_case(rank: int, nproc: int, case: Case) -> Reports:
    generated = load_module(case.module_path)
    info = generated.SCHEDULE
    owned = generated.stages_of_rank(rank)
    model = build(case.family, layers=max(LAYERS, info.stages))
    cut = pipeforge.split(torch_pipe(copy.deepcopy(model), case.family, info.stages), info, owned=owned)
    pipe = generated.make_pipeline(cut.modules, loss_fn=loss_fn, tied_parameters=cut.tied_parameters, timeout=60)
    report = Reports(case.label, rank)
    torch_run = TorchRun(copy.deepcopy(model), case, info, owned)
    for step in range(case.steps):
        tokens, extra, target = batch(case.family, info.microbatches, step)
        losses: list = []
        pipe.step(*((tokens,) if pipe.holds_first else ()), target=target if pipe.holds_last else None,
                  losses=losses, **(extra if pipe.holds_first else {}))
        want_losses, want_grads = unpipelined_step(model, tokens, extra, target, info.microbatches)
        torch_losses, torch_grads = torch_run.step(tokens, target)
        for m, loss in enumerate(losses):
            if loss is None:  # a bidirectional schedule finished microbatch m on the other chain's rank
                continue
            report.add("unpipelined", f"step {step} loss {m}", loss, want_losses[m])
            if torch_losses is not None:
                report.add("torch", f"step {step} loss {m}", loss, torch_losses[m])
        if pipe.holds_last and len(losses) != info.microbatches:
            report.missing(f"step {step}: {len(losses)} losses")
        for stage, module in cut.modules.items():
            for name, param in module.named_parameters():
                what = f"step {step} grad of stage {stage} {name}"
                report.add("unpipelined", what, param.grad, want_grads[name])
                if torch_grads is not None:
                    report.add("torch", what, param.grad, torch_grads[stage, name])
        sgd(pipe.parameters())
    if len(info.placements) == 1:  # on two chains a rank's eval outputs are the microbatches its chain finished
        compare_eval(pipe, model, torch_run, case, info.microbatches, report)
    for stage, module in cut.modules.items():
        for name, param in module.named_parameters():
            what = f"stage {stage} {name} after {case.steps} steps"
            report.add("unpipelined", what, param, model.get_parameter(name))
            if torch_run.ran:
                report.add("torch", what, param, torch_run.parameter(stage, name))
    return report


def compare_eval(pipe, model: nn.Module, torch_run: TorchRun, case: Case, microbatches: int,
                 report: Reports) -> None:
    """``eval`` after the steps: the merged outputs against torch's ``schedule.eval`` and the model's own."""
    tokens, extra, target = batch(case.family, microbatches, 99)
    got = pipe.eval(*((tokens,) if pipe.holds_first else ()), **(extra if pipe.holds_first else {}))
    theirs = torch_run.eval(tokens, target)
    with torch.no_grad():
        pieces = [model(x, **{name: value.tensor_split(microbatches)[m] for name, value in extra.items()})
                  for m, x in enumerate(tokens.tensor_split(microbatches))]
        want = torch.cat([getattr(piece, "logits", piece) for piece in pieces])
    if not pipe.holds_last:
        return
    report.add("unpipelined", "eval outputs", got, want)
    if theirs is not None:
        report.add("torch", "eval outputs", got, theirs)


def unpipelined_step(model: nn.Module, tokens, extra: dict, target, microbatches: int):
    losses = []
    for m, (x, y) in enumerate(zip(tokens.tensor_split(microbatches), target.tensor_split(microbatches))):
        output = model(x, **{name: value.tensor_split(microbatches)[m] for name, value in extra.items()})
        loss = loss_fn(getattr(output, "logits", output), y)
        (loss / microbatches).backward()
        losses.append(loss.detach())
    grads = {name: p.grad.clone() for name, p in model.named_parameters(remove_duplicate=False)}
    sgd(model.parameters())
    return losses, grads


class TorchRun:
    """torch's own runtime on its own trace of the model: ``pipe.build_stage`` and the case's schedule class."""

    def __init__(self, model: nn.Module, case: Case, info, owned):
        from torch.distributed.pipelining import schedules

        self.case, self.owned = case, list(owned)
        self.pipe = torch_pipe(model, case.family, info.stages)
        self.ran = False
        if case.torch_schedule is None:
            return
        self.stages = [self.pipe.build_stage(s, torch.device("cpu")) for s in self.owned]
        cls = getattr(schedules, case.torch_schedule)
        single = issubclass(cls, schedules.PipelineScheduleSingle)
        self.schedule = cls(self.stages[0] if single else self.stages, info.microbatches, loss_fn=loss_fn)
        self.first, self.last = 0 in self.owned, info.stages - 1 in self.owned

    def parameter(self, stage: int, name: str) -> torch.Tensor:
        return self.pipe.get_stage_module(stage).get_parameter(name)

    def step(self, tokens, target):
        if self.case.torch_schedule is None:
            return None, None
        losses: list = []
        self.schedule.step(*((tokens,) if self.first else ()), target=target if self.last else None,
                           losses=losses if self.last else None)
        self.all_reduce_replicated()
        grads = {(s, name): p.grad.clone() if p.grad is not None else None for s in self.owned
                 for name, p in self.pipe.get_stage_module(s).named_parameters()}
        sgd(p for s in self.owned for p in self.pipe.get_stage_module(s).parameters())
        self.ran = True
        return (losses if self.last else None), grads

    def eval(self, tokens, target):
        if self.case.torch_schedule is None:
            return None
        # torch's eval computes the loss on the last stage whenever a loss_fn is set: it needs the target
        return self.schedule.eval(*((tokens,) if self.first else ()), target=target if self.last else None,
                                  losses=[] if self.last else None)

    def all_reduce_replicated(self) -> None:
        """torch's ``pipe.replicated_params`` (a tied weight's copies): their gradients summed, as torch asks."""
        for mapping in self.pipe.replicated_params:
            copies = [(int(submod.rsplit("_", 1)[1]), name) for submod, name in mapping.items()]
            shape = self.parameter(*copies[0])
            total = torch.zeros_like(shape)
            mine = [self.parameter(s, name) for s, name in copies if s in self.owned]
            for param in mine:
                if param.grad is not None:
                    total += param.grad
            dist.all_reduce(total)
            for param in mine:
                param.grad = total.clone()


def wrong_shape(rank: int, nproc: int, module_path: str) -> dict:
    """A step whose microbatches have twice the rows the Pipe was traced with: what each rank raises, and when."""
    import time

    generated = load_module(module_path)
    info = generated.SCHEDULE
    cut = pipeforge.split(torch_pipe(build("gpt2"), "gpt2", info.stages), info, owned=generated.stages_of_rank(rank))
    pipe = generated.make_pipeline(cut.modules, loss_fn=loss_fn, tied_parameters=cut.tied_parameters, timeout=60)
    tokens, _, target = batch("gpt2", 2 * info.microbatches, 0)
    start = time.monotonic()
    try:
        pipe.step(*((tokens,) if pipe.holds_first else ()), target=target if pipe.holds_last else None)
    except Exception as error:
        return {"error": type(error).__name__, "message": str(error), "seconds": time.monotonic() - start}
    return {"error": None, "message": "", "seconds": time.monotonic() - start}
