"""Train a model that torch's ``pipeline()`` split, under a generated pipeline, on CPU, under torchrun.

    torchrun --nproc-per-node 2 examples/train_torch_pipeline.py                 # GPT-2 in 2 stages, 1F1B
    torchrun --nproc-per-node 2 examples/train_torch_pipeline.py --schedule zbv  # 4 stages in a V

Every rank builds the same GPT-2 from a small config, and torch's ``pipeline()``
traces it on one microbatch and cuts it before the blocks that start each stage.
``pipeforge.split`` takes that ``Pipe``: its stages at torch's cut, the attention
mask that stage 0 makes riding to every later stage, and torch's copies of the
tied embedding and LM head as ``cut.tied_parameters``. Any library schedule
runs it, including those torch's own runtime refuses for such a split (its
multi-stage schedules take no skip connections). See ``docs/models.md``.
"""

from __future__ import annotations

import argparse
import sys
import types

import torch
import torch.distributed as dist
import torch.nn.functional as F
import transformers
from torch.distributed.pipelining import SplitPoint, pipeline

import pipeforge
from pipeforge.generator import generate


def pipeline_module(schedule: str, ranks: int, microbatches: int) -> types.ModuleType:
    """The generated module, rendered on every rank (the same text) and imported."""
    module = types.ModuleType("pipeline")
    text = generate(pipeforge.load(schedule, defines={"P": ranks, "M": microbatches}))
    exec(compile(text, "<pipeline>", "exec"), module.__dict__)  # noqa: S102 (pipeforge's own verified output)
    return module


def torch_split(stages: int, rows: int, seq: int, vocab: int):
    """GPT-2 (4 blocks, or one per stage) cut by torch's pipeline(), traced on a microbatch of ``rows`` rows."""
    torch.manual_seed(0)  # every rank builds the same model
    layers = max(4, stages)
    config = transformers.GPT2Config(vocab_size=vocab, n_embd=64, n_layer=layers, n_head=4, bos_token_id=0,
                                     eos_token_id=0, use_cache=False)
    model = transformers.GPT2LMHeadModel(config)
    split_spec = {f"transformer.h.{layers * s // stages}": SplitPoint.BEGINNING for s in range(1, stages)}
    return pipeline(model, (torch.zeros(rows, seq, dtype=torch.long),), split_spec=split_spec)


def loss_fn(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), target.reshape(-1))


def batches(vocab: int, rows: int, seq: int):
    """Windows of one random text: token ids and next-token targets."""
    generator = torch.Generator().manual_seed(0)
    text = torch.randint(vocab, (8 * seq,), generator=generator)
    while True:
        starts = torch.randint(len(text) - seq - 1, (rows,), generator=generator).tolist()
        windows = torch.stack([text[s: s + seq + 1] for s in starts])
        yield windows[:, :-1], windows[:, 1:]


def train(args: argparse.Namespace) -> list[float]:
    rank = dist.get_rank()
    pipeline_code = pipeline_module(args.schedule, dist.get_world_size(), args.microbatches)
    stages = pipeline_code.SCHEDULE.stages
    pipe_of_torch = torch_split(stages, args.rows // args.microbatches, args.seq, args.vocab)
    cut = pipeforge.split(pipe_of_torch, pipeline_code.SCHEDULE, owned=pipeline_code.stages_of_rank(rank))
    pipe = pipeline_code.make_pipeline(cut.modules, loss_fn=loss_fn, tied_parameters=cut.tied_parameters,
                                       timeout=args.timeout)
    optimizer = torch.optim.AdamW(pipe.parameters(), lr=args.lr)
    history = []
    for _, (tokens, target) in zip(range(args.steps), batches(args.vocab, args.rows, args.seq)):
        losses: list = []
        pipe.step(*((tokens,) if pipe.holds_first else ()), target=target if pipe.holds_last else None,
                  losses=losses)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if pipe.holds_last:  # the mean of the microbatches' losses
            done = [loss.item() for loss in losses if loss is not None]
            history.append(sum(done) / len(done))
    return history


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--schedule", default="1f1b")
    parser.add_argument("--microbatches", type=int, default=4)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--rows", type=int, default=8)
    parser.add_argument("--seq", type=int, default=16)
    parser.add_argument("--vocab", type=int, default=128)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--timeout", type=float, default=120.0)
    args = parser.parse_args(argv)
    if args.rows % args.microbatches:
        parser.error("--rows must be a multiple of --microbatches (torch traces one microbatch's shape)")
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    try:
        history = train(args)
        if history:
            print(f"rank {dist.get_rank()}: loss {history[0]:.4f} -> {history[-1]:.4f} after {len(history)} steps",
                  flush=True)
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
