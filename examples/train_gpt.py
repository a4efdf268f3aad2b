"""Train a small GPT with a pipeforge-generated pipeline, on CPU, under torchrun.

    torchrun --nproc-per-node 4 examples/train_gpt.py                    # 1F1B, P=4, M=8
    torchrun --nproc-per-node 4 examples/train_gpt.py --schedule zbv     # any library schedule
    torchrun --nproc-per-node 4 examples/train_gpt.py --module gen/my.py # a module `pipeforge codegen` wrote

The steps, as in examples/README.md:

1. a pipeline module: ``pipeforge codegen SCHEDULE -o gen/`` ahead of time
   (``--module``), or generated here at startup (``pipeforge.generator.generate``
   on rank 0, its text broadcast to the others);
2. the stages this rank holds: ``module.stages_of_rank(rank)`` (stage indices,
   ascending; with a V or interleaved placement a rank holds several);
3. one ``nn.Module`` per held stage (``examples/gpt.py``: the model split into
   ``module.SCHEDULE.stages`` contiguous pieces: the embedding in stage 0, the LM
   head in the last);
4. ``pipe = module.make_pipeline(stage_modules, loss_fn=...)``;
5. each step: ``pipe.step(tokens, target=next_tokens, losses=losses)`` — the
   batch on the rank holding stage 0, the target on the rank holding the last
   stage (the two may be the same rank), ``None`` elsewhere — then the
   optimizer over ``pipe.parameters()``.

The data is a fixed random token sequence the model learns to continue, so the
loss falls quickly: enough to see training work without downloading anything.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import types
from pathlib import Path

import torch
import torch.distributed as dist

from gpt import GPTConfig, gpt_stages, lm_loss, token_batches  # examples/gpt.py: the model, beside this script


# -- the pipeline module -------------------------------------------------------------------------

def load_generated(path: str):
    """Import the module ``pipeforge codegen`` wrote (any file name)."""
    spec = importlib.util.spec_from_file_location(Path(path).stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def generate_at_startup(schedule: str, ranks: int, microbatches: int):
    """Rank 0 lowers, verifies and renders the module; every rank imports the same text (sent by
    ``pipeforge.runtime.objects``: torch's ``broadcast_object_list`` needs numpy, which torch does not install)."""
    from pipeforge.runtime.objects import broadcast_object

    text = None
    if dist.get_rank() == 0:
        import pipeforge
        from pipeforge.generator import generate

        text = generate(pipeforge.load(schedule, defines={"P": ranks, "M": microbatches}))
    text = broadcast_object(text, src=0)
    module = types.ModuleType(f"pipeline_{schedule.replace('-', '_')}")
    exec(compile(text, f"<pipeforge codegen {schedule}>", "exec"), module.__dict__)
    return module


# -- training ------------------------------------------------------------------------------------

def train(args: argparse.Namespace) -> list[float]:
    """Train; returns the mean loss of each step on the rank(s) holding the last stage ([] elsewhere)."""
    rank, ranks = dist.get_rank(), dist.get_world_size()
    config = GPTConfig(vocab=args.vocab, seq=args.seq, width=args.width, heads=args.heads, layers=args.layers)
    if args.module:
        generated = load_generated(args.module)
    else:
        generated = generate_at_startup(args.schedule, ranks, args.microbatches)
    info = generated.SCHEDULE
    mine = generated.stages_of_rank(rank)  # the stages this rank holds
    pieces = gpt_stages(config, info.stages, seed=args.seed)  # every rank builds the same weights
    stage_modules = {stage: pieces[stage] for stage in mine}
    del pieces
    pipe = generated.make_pipeline(stage_modules, loss_fn=lm_loss, timeout=args.timeout)
    optimizer = torch.optim.AdamW(pipe.parameters(), lr=args.lr)  # each parameter once, shared ones too
    batches = token_batches(config, args.rows)
    history = []
    for step in range(args.steps):
        tokens, next_tokens = next(batches)  # every rank draws the same batch; only two use it
        losses: list = []
        optimizer.zero_grad(set_to_none=True)
        pipe.step(*((tokens,) if pipe.holds_first else ()), target=next_tokens if pipe.holds_last else None,
                  losses=losses)
        optimizer.step()
        if pipe.holds_last:
            mean = torch.stack([loss for loss in losses if loss is not None]).mean().item()
            history.append(mean)
            if args.verbose:
                print(f"rank {rank} (stages {list(mine)}): step {step} loss {mean:.4f}", flush=True)
    return history


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--schedule", default="1f1b", help="a library schedule (generated at startup)")
    parser.add_argument("--module", help="a module `pipeforge codegen` wrote (instead of --schedule)")
    parser.add_argument("--microbatches", type=int, default=8)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--rows", type=int, default=16, help="sequences per batch (split into microbatches)")
    parser.add_argument("--vocab", type=int, default=128)
    parser.add_argument("--seq", type=int, default=32)
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds a rank waits for a peer")
    parser.add_argument("--quiet", dest="verbose", action="store_false")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    try:
        history = train(args)
        if history:
            print(f"rank {dist.get_rank()}: loss {history[0]:.4f} -> {history[-1]:.4f} "
                  f"after {len(history)} steps", flush=True)
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
