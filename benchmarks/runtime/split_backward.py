"""The backward split in I and W against the fused backward B, pipeforge's and torch's, side by side.

    python -m benchmarks.runtime.split_backward                 # 60 rounds, 2 rows a microbatch
    python -m benchmarks.runtime.split_backward --rounds 200 --rows 4 --clock wall

On the same modules and the same microbatch shapes, each round runs, in turn,
one forward followed by:

- ``B``: ``torch.autograd.backward`` (what 1F1B runs);
- ``pipeforge``: ``SplitBackward.backward_input`` (I) then
  ``accumulate_weight_gradients`` (W), as the runtime runs them, with one
  ``SplitBackward`` kept for the module across rounds as the runtime keeps one
  per stage;
- ``torch``: ``torch.distributed.pipelining._backward.stage_backward_input``
  then ``stage_backward_weight``. On a first stage (no input gradient) torch's
  runtime runs no I and a full backward as W (``stage.py``,
  ``backward_weight_one_chunk``); so does this benchmark.

Modules: the stages of ``benchmarks/profile/gpt_unequal.py`` (first: embedding and
two blocks; middle: two ``nn.TransformerEncoderLayer`` blocks; last: two
blocks, the LM head and the loss) and one ``nn.TransformerEncoderLayer``.
One torch thread; the clock is this thread's CPU time by default (on a shared
machine it is far less noisy than wall time, and the autograd engine runs CPU
work on the calling thread). Reported per module: the medians of B, I, W, the
ratios (I + W) / B of both, and whether each split gave the fused backward's
gradients (bit for bit: ``exact``; else the largest relative difference).

A second table (bytes, which do not depend on the machine's load): on the middle and last stage of
each model of the test zoo (3 stages, float64), what a forward leaves saved (``activation``, the
runtime's accounting, ``runtime.saved.counted``) and what is still saved after I, until W
(``weight_grad``), pipeforge's I against torch's ``stage_backward_input``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import gc

import torch
from torch import nn
from torch.distributed.pipelining._backward import stage_backward, stage_backward_input, stage_backward_weight

from benchmarks.profile import gpt_unequal
from pipeforge.runtime.split_backward import SplitBackward, accumulate_weight_gradients


class Case:
    """One module and how to make a microbatch's forward: ``run()`` gives (inputs, roots, root grads)."""

    def __init__(self, name: str, module: nn.Module, make_input, loss=None):
        self.name, self.module, self.make_input, self.loss = name, module, make_input, loss
        self.params = [p for p in module.parameters() if p.requires_grad]
        self.split = SplitBackward()

    def run(self, seed: int):
        generator = torch.Generator().manual_seed(seed)
        x = self.make_input(generator)
        inputs = [x] if x.is_floating_point() else []
        out = self.module(x)
        if self.loss is not None:
            return inputs, (self.loss(out, generator),), (None,)
        return inputs, (out,), (torch.randn(out.shape, generator=generator),)


def cases(rows: int) -> list[Case]:
    gpt = gpt_unequal
    torch.manual_seed(0)
    first, middle, last = gpt.Stage(True, False), gpt.Stage(False, False), gpt.Stage(False, True)
    hidden = (rows, gpt.SEQ, gpt.WIDTH)

    def tokens(generator):
        return torch.randint(0, gpt.VOCAB, (rows, gpt.SEQ), generator=generator)

    def activations(generator):
        return torch.randn(*hidden, generator=generator).requires_grad_()

    def lm_loss(logits, generator):
        return gpt.loss_fn(logits, torch.randint(0, gpt.VOCAB, (rows, gpt.SEQ), generator=generator))

    layer = nn.TransformerEncoderLayer(gpt.WIDTH, gpt.HEADS, 4 * gpt.WIDTH, dropout=0.0, batch_first=True)
    return [Case("gpt first stage", first, tokens), Case("gpt middle stage", middle, activations),
            Case("gpt last stage", last, activations, lm_loss), Case("TransformerEncoderLayer", layer, activations)]


def fused(case: Case, inputs, roots, grads, clock):
    started = clock()
    torch.autograd.backward(roots, grads)
    return clock() - started, 0.0


def pipeforge_split(case: Case, inputs, roots, grads, clock):
    started = clock()
    found, plan = case.split.backward_input(roots, grads, inputs, case.params)
    for x, grad in zip(inputs, found):
        x.grad = grad
    middle = clock()
    accumulate_weight_gradients(plan)
    return middle - started, clock() - middle


def torch_split(case: Case, inputs, roots, grads, clock):
    grads = [torch.ones_like(r) if g is None else g for r, g in zip(roots, grads)]
    started = clock()
    if not inputs:  # torch's runtime: no I on the first stage, a full backward as W
        middle = clock()
        stage_backward(roots, grads, inputs)
        return middle - started, clock() - middle
    _, groups = stage_backward_input(list(roots), grads, inputs, iter(case.params))
    middle = clock()
    stage_backward_weight(iter(case.params), groups)
    return middle - started, clock() - middle


METHODS = {"B": fused, "pipeforge": pipeforge_split, "torch": torch_split}


def gradients(case: Case, method, seed: int) -> list[torch.Tensor | None]:
    case.module.zero_grad(set_to_none=True)
    inputs, roots, grads = case.run(seed)
    method(case, inputs, roots, grads, time.perf_counter)
    found = [p.grad for p in case.params] + [x.grad for x in inputs]
    case.module.zero_grad(set_to_none=True)
    return found


def difference(got: list, want: list) -> str:
    if all((g is None and w is None) or (g is not None and w is not None and torch.equal(g, w))
           for g, w in zip(got, want)):
        return "exact"
    worst = max(float((g - w).abs().max() / w.abs().max().clamp_min(1e-30))
                for g, w in zip(got, want) if g is not None and w is not None)
    return f"{worst:.1e}"


def measure(case: Case, rounds: int, warmup: int, clock) -> dict[str, tuple[float, float]]:
    samples: dict[str, list[tuple[float, float]]] = {name: [] for name in METHODS}
    for index in range(warmup + rounds):
        for name, method in METHODS.items():
            case.module.zero_grad(set_to_none=True)
            inputs, roots, grads = case.run(index)
            timing = method(case, inputs, roots, grads, clock)
            if index >= warmup:
                samples[name].append(timing)
    return {name: (statistics.median(i for i, _ in s) * 1e3, statistics.median(w for _, w in s) * 1e3,
                   statistics.median(i + w for i, w in s) * 1e3) for name, s in samples.items()}


ZOO = ("gpt", "gpt-dropout", "llama", "moe", "tied")


def held_after_input(model: str, stage: int, split: str) -> tuple[int, int]:
    """(activation, weight_grad) bytes of ``stage`` of the zoo's ``model`` cut in 3, ``split`` "pipeforge" or
    "torch"; W then runs, and nothing may stay saved after it."""
    from pipeforge.runtime.saved import SavedBytes, counted
    from tests.zoo import models as zoo

    module = zoo.build(model, 3)[stage]
    params = [p for p in module.parameters() if p.requires_grad]
    _, targets, every_stage = zoo.batch(model, 2, 0)
    x = torch.randn(2, zoo.SEQ, zoo.WIDTH, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    x.requires_grad_()
    counter = SavedBytes()
    with counted(counter, {p.untyped_storage().data_ptr() for p in params}):
        out = module(x, **every_stage)
        out = zoo.loss_fn(out, targets) if stage == 2 else out
    activation, grad = counter.held, torch.ones_like(out)
    if split == "pipeforge":
        _, plan = SplitBackward().backward_input((out,), (grad,), [x], params)
        weight_grad = counter.held
        accumulate_weight_gradients(plan)
        del plan
    else:
        _, groups = stage_backward_input([out], [grad], [x], iter(params))
        weight_grad = counter.held
        stage_backward_weight(iter(params), groups)
        del groups
    del out
    gc.collect()
    if counter.held:
        raise RuntimeError(f"{model} stage {stage}, {split}: {counter.held} bytes still saved after W")
    return activation, weight_grad


def memory_table() -> None:
    print("\nbytes saved from I to W (weight_grad) of what the forward saved (activation), test zoo, 3 stages")
    print(f"{'model':14}{'stage':>6}{'activation':>12}{'pf weight_grad':>16}{'/ act':>7}{'torch weight_grad':>19}"
          f"{'/ act':>7}")
    for model in ZOO:
        for stage in (1, 2):
            activation, ours = held_after_input(model, stage, "pipeforge")
            _, theirs = held_after_input(model, stage, "torch")
            print(f"{model:14}{stage:6d}{activation:12d}{ours:16d}{ours / activation:7.3f}{theirs:19d}"
                  f"{theirs / activation:7.3f}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=60)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--rows", type=int, default=2, help="sequences per microbatch (gpt_unequal: 16 / M=8 = 2)")
    parser.add_argument("--clock", choices=("cpu", "wall"), default="cpu")
    args = parser.parse_args()
    torch.set_num_threads(1)
    clock = time.thread_time if args.clock == "cpu" else time.perf_counter
    print(f"torch {torch.__version__}, 1 thread, {args.rounds} rounds, {args.rows} rows a microbatch, "
          f"{args.clock} clock; ms are medians")
    print(f"{'module':24}{'B':>7}{'pf I':>8}{'pf W':>7}{'pf I+W/B':>10}{'torch I':>9}{'torch W':>9}"
          f"{'torch I+W/B':>13}  gradients (pipeforge, torch)")
    for case in cases(args.rows):
        want = gradients(case, fused, 10**6)
        exact = [difference(gradients(case, METHODS[n], 10**6), want) for n in ("pipeforge", "torch")]
        got = measure(case, args.rounds, args.warmup, clock)
        b, ours, theirs = got["B"][2], got["pipeforge"], got["torch"]
        print(f"{case.name:24}{b:7.2f}{ours[0]:8.2f}{ours[1]:7.2f}{ours[2] / b:10.2f}"
              f"{theirs[0]:9.2f}{theirs[1]:9.2f}{theirs[2] / b:13.2f}  {exact[0]}, {exact[1]}")
    memory_table()
    return 0


if __name__ == "__main__":
    sys.exit(main())
