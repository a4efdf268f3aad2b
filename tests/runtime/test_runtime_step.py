"""torch's step() contract on real gloo ranks: splitting, merging, losses, per-stage inputs, no graph left; misuse errors.

One spawn runs the whole contract on zb-h1 (I and W split) with a model whose
batch is a dict, whose stage 0 takes keyword arguments, whose every stage takes
a mask (``shared_kwargs``), whose last stage alone takes a bias
(``stage_kwargs``) and returns a dict; another collects the errors of misuse.
"""

from __future__ import annotations

import pytest

import pipeforge
from pipeforge.generator import codegen
from pipeforge.tools.launch import spawn

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(300)]

WIDTH, ROWS, MICROBATCHES = 4, 10, 4


def build_stages():
    import torch
    from torch import nn

    class First(nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = nn.Linear(WIDTH, WIDTH)
            self.rows_seen: list[int] = []

        def forward(self, batch, *, scale, mask):
            assert batch["tag"] == "keep" and isinstance(scale, float)
            self.rows_seen.append(batch["x"].size(0))
            return torch.tanh(self.linear(batch["x"] * scale) * mask)

    class Last(nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = nn.Linear(WIDTH, WIDTH)

        def forward(self, h, *, mask, bias):
            out = self.linear(h * mask) + bias
            return {"out": out, "aux": (out.sum(-1), "tag")}

    torch.manual_seed(0)
    return [First().double(), Last().double()]


def loss_fn(output, target):
    import torch

    return torch.nn.functional.mse_loss(output["out"], target)


def make_inputs():
    import torch

    generator = torch.Generator().manual_seed(1)
    x = torch.randn(ROWS, WIDTH, generator=generator, dtype=torch.float64)
    target = torch.randn(ROWS, WIDTH, generator=generator, dtype=torch.float64)
    mask = torch.rand(ROWS, WIDTH, generator=generator, dtype=torch.float64)
    bias = torch.randn(ROWS, WIDTH, generator=generator, dtype=torch.float64)
    return x, target, mask, bias


def reference(stages, x, target, mask, bias) -> tuple[list, list]:
    """Microbatch by microbatch in one process; gradients divided by the microbatch count."""
    import torch

    losses, outs = [], []
    for m in range(MICROBATCHES):
        pick = lambda t, m=m: t.tensor_split(MICROBATCHES)[m]  # noqa: E731
        h = stages[0]({"x": pick(x), "tag": "keep"}, scale=0.5, mask=pick(mask))
        out = stages[1](h, mask=pick(mask), bias=pick(bias))
        loss = loss_fn(out, pick(target))
        loss.backward()
        losses.append(loss.detach())
        outs.append(out["out"].detach())
    for stage in stages:
        for param in stage.parameters():
            param.grad /= MICROBATCHES
    return losses, [torch.cat(outs)]


def step_contract(rank: int, nproc: int, path: str) -> dict:
    import copy
    import weakref

    import torch

    from pipeforge.tools.generated import load_module

    full = build_stages()
    want = copy.deepcopy(full)
    x, target, mask, bias = make_inputs()
    want_losses, (want_out,) = reference(want, x, target, mask, bias)
    pipe = load_module(path).make_pipeline({rank: full[rank]}, loss_fn=loss_fn, timeout=30)
    saved = []

    class Holder:
        def __init__(self, tensor):
            self.tensor = tensor.detach()  # detached: the holder itself must not keep a graph alive

    def pack(tensor):
        holder = Holder(tensor)
        saved.append(weakref.ref(holder))
        return holder

    losses = ["stale", "entries", "from", "before", "this", "step"]
    common = {"shared_kwargs": {"mask": mask}, "stage_kwargs": {1: {"bias": bias}}}
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda holder: holder.tensor):
        if rank == 0:
            out = pipe.step({"x": x, "tag": "keep"}, scale=0.5, **common)
        else:
            out = pipe.step(target=target, losses=losses, **common)
    result = {"saved": len(saved), "alive_after_step": sum(ref() is not None for ref in saved)}
    grads = [(p.grad - q.grad).abs().max().item() for p, q in zip(full[rank].parameters(), want[rank].parameters())]
    result["grad_diff"] = max(grads)
    if rank == 0:
        result["rows_seen"] = full[0].rows_seen
        return result
    result["losses"] = len(losses)
    result["loss_diff"] = max((a - b).abs().item() for a, b in zip(losses, want_losses))
    result["out_keys"] = sorted(out)
    result["out_diff"] = (out["out"] - want_out).abs().max().item()
    result["aux"] = [tuple(out["aux"][0].shape), out["aux"][1]]
    result["out_requires_grad"] = out["out"].requires_grad or out["out"].grad_fn is not None
    return result


def test_step_splits_merges_and_leaves_no_graph_behind(tmp_path):
    path = str(codegen(pipeforge.load("zb-h1", defines={"P": 2, "M": MICROBATCHES}), tmp_path))
    outcomes = spawn(step_contract, 2, path, timeout=30, deadline=150)
    assert all(o.ok for o in outcomes), "\n".join(o.error for o in outcomes if not o.ok)
    first, last = outcomes[0].value, outcomes[1].value
    # the dict batch split on dim 0, as torch.tensor_split does, after the first step's check of microbatch 0
    assert first["rows_seen"] == [3, 3, 3, 2, 2]
    for result in (first, last):
        assert result["saved"] > 0 and result["alive_after_step"] == 0, result
        assert result["grad_diff"] < 1e-12, result
    assert last["losses"] == MICROBATCHES and last["loss_diff"] < 1e-12
    assert last["out_keys"] == ["aux", "out"] and last["out_diff"] < 1e-12
    assert last["aux"] == [(ROWS,), "tag"] and not last["out_requires_grad"]


# -- misuse: clear errors naming the rank, the stage and the argument ----------------------------


def misuse(rank: int, nproc: int, paths: dict) -> dict:
    """Each misuse raises before any compute, on the rank that tries it and on its peer (the first step's
    check, or the step's greeting)."""
    import types

    import torch

    from pipeforge.runtime import PipelineUsageError
    from pipeforge.tools.generated import load_module
    from pipeforge.tools import demo_models as models
    from tests.zoo import models as zoo

    generated = load_module(paths["1f1b"])
    stages = models.build_stages("mlp", 2)
    errors = {}

    def attempt(label, call):
        try:
            call()
        except PipelineUsageError as error:
            errors[label] = str(error)

    attempt("one module", lambda: generated.make_pipeline(stages[rank], loss_fn=models.loss_fn))
    attempt("rank out of range", lambda: generated.make_pipeline({rank: stages[rank]}, rank=5))
    attempt("tied group of one", lambda: generated.make_pipeline({rank: stages[rank]}, tied_parameters=[[(0, "a")]]))
    attempt("unknown tied name", lambda: generated.make_pipeline(  # stage 1 lacks it: both ranks raise, none waits
        {rank: stages[rank]}, tied_parameters=[[(0, "linear.bias"), (1, "nope")]], timeout=30))
    pipe = generated.make_pipeline({rank: stages[rank]}, loss_fn=models.loss_fn, timeout=30)
    x, y = models.make_batch(2, 4, seed=0)
    if rank == 1:
        misuses = [("missing target", lambda: pipe.step()),
                   ("batch on a later stage", lambda: pipe.step(x, target=y)),
                   ("stage out of range", lambda: pipe.step(target=y, stage_kwargs={7: {"mask": x}})),
                   ("shared kwargs not a dict", lambda: pipe.step(target=y, shared_kwargs=[x])),
                   ("name in both", lambda: pipe.step(target=y, shared_kwargs={"m": x}, stage_kwargs={1: {"m": x}}))]
    else:
        misuses = [("target on the first stage", lambda: pipe.step(x, target=y)),
                   ("nested unsplittable", lambda: pipe.step(x, extra=types.SimpleNamespace(ids=x)))]
    sound = (lambda: pipe.step(target=y)) if rank == 1 else (lambda: pipe.step(x))
    for index in range(5):  # every rank calls step() as often: a refusal reaches every rank (the other's error)
        attempt(*misuses[index]) if index < len(misuses) else attempt("the peer's misuse", sound)
    assert "the peer's misuse" in errors or rank == 1, errors

    # tied copies and Chimera replicas that do not start equal: both ranks find out together
    tied = zoo.build("tied", 2, seed=rank)  # each rank built from its own seed: the tie's copies differ
    tied_pipe = lambda: load_module(paths["1f1b"]).make_pipeline(  # noqa: E731
        {rank: tied[rank]}, tied_parameters=zoo.tied_parameters("tied", 2), timeout=30)
    attempt("tied copies differ", tied_pipe)
    chimera = load_module(paths["chimera"])
    mine = models.build_stages("mlp", 2, seed=rank)  # replicas of one stage on two ranks, different seeds
    attempt("chimera replicas differ", lambda: chimera.make_pipeline({0: mine[0], 1: mine[1]}, timeout=30))
    shared = models.build_stages("mlp", 2)
    shared[1].linear.weight = torch.nn.Parameter(torch.zeros_like(shared[1].linear.weight))
    shared[0].linear.bias = shared[1].linear.bias = torch.nn.Parameter(torch.zeros(shared[0].linear.bias.shape))
    attempt("chimera shared parameter", lambda: chimera.make_pipeline({0: shared[0], 1: shared[1]}, timeout=30))
    return errors


def expected_errors(rank: int) -> dict[str, str]:
    """What every rank's error says, by misuse."""
    return {
        "one module": "stage_modules must be a dict from each stage this rank runs to its module",
        "rank out of range": "rank 5 is out of range: schedule 'one_f_one_b' runs on ranks 0..1",
        "tied group of one": "tied_parameters group 0 names 1 distinct parameter(s)",
        "unknown tied name": "names 'nope' of stage 1" if rank else "tied parameter group 0 (stage 0 'linear.bias', "
                             "stage 1 'nope') has shape",
        "tied copies differ": "tied parameter group 0 (stage 0 'embed.tokens.weight', stage 1 'head.out.weight') "
                              "differs from rank",
        "chimera replicas differ": "differs from rank",
        "chimera shared parameter": "share one parameter",
    }


def test_misuse_is_a_clear_error_naming_rank_stage_and_argument(tmp_path):
    paths = {name: str(codegen(pipeforge.load(name, defines={"P": 2, "M": 2}), tmp_path / name))
             for name in ("1f1b", "chimera")}
    outcomes = spawn(misuse, 2, paths, timeout=30, deadline=150)
    assert all(o.ok for o in outcomes), "\n".join(o.error for o in outcomes if not o.ok)
    first, last = outcomes[0].value, outcomes[1].value
    for rank, errors in enumerate((first, last)):
        for label, fragment in expected_errors(rank).items():
            assert fragment in errors.get(label, ""), (rank, label, errors.get(label))
            assert errors[label].startswith(f"rank {rank}") or label == "rank out of range", errors[label]
    assert "rank 1 holds the last stage 1: step() needs target=" in last["missing target"]
    assert "not stage 0: the batch goes to the rank holding stage 0 (rank 0)" in last["batch on a later stage"]
    assert "stage_kwargs: 7 is not a stage" in last["stage out of range"]
    assert "shared_kwargs must be a dict" in last["shared kwargs not a dict"]
    assert "['m'] of stage 1 given both" in last["name in both"]
    assert "not the last stage 1: target= goes to the rank holding the last stage" in first["target on the first stage"]
    assert "keyword 'extra': a SimpleNamespace holding tensors" in first["nested unsplittable"]
