"""Train a Hugging Face causal LM through ``pipeforge.split`` and a generated pipeline, on CPU, under torchrun.

    torchrun --nproc-per-node 2 examples/train_hf.py                        # a small Llama, 1F1B
    torchrun --nproc-per-node 2 examples/train_hf.py --schedule zbv --family mixtral

The model is built from a config on the meta device; each rank materializes only
the stages it runs (``split(..., owned=...)``), ties come from the model
(``cut.tied_parameters``), the loss is the token mean of padded batches
(``TokenMeanLoss``, with ``scale_grads=False``), an MoE's balancing loss rides
the auxiliary channel, and ``pipe.check`` runs one microbatch through every
stage before the first step. See ``examples/README.md`` and ``docs/models.md``.
"""

from __future__ import annotations

import argparse
import sys
import types

import torch
import torch.distributed as dist
import transformers

import pipeforge
from pipeforge.generator import generate
from pipeforge.models import TokenMeanLoss

CONFIGS = {  # small configs of three families (no download)
    "llama": lambda v: transformers.LlamaConfig(vocab_size=v, hidden_size=64, intermediate_size=128,
                                                num_hidden_layers=4, num_attention_heads=4, tie_word_embeddings=True),
    "gpt2": lambda v: transformers.GPT2Config(vocab_size=v, n_embd=64, n_layer=4, n_head=4, bos_token_id=0,
                                              eos_token_id=0),
    "mixtral": lambda v: transformers.MixtralConfig(vocab_size=v, hidden_size=64, intermediate_size=64,
                                                    num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                                                    num_local_experts=4, experts_implementation="eager"),
}


def pipeline_module(schedule: str, ranks: int, microbatches: int) -> types.ModuleType:
    """The generated module, rendered on every rank (the same text) and imported."""
    module = types.ModuleType("pipeline")
    text = generate(pipeforge.load(schedule, defines={"P": ranks, "M": microbatches}))
    exec(compile(text, "<pipeline>", "exec"), module.__dict__)  # noqa: S102 (pipeforge's own verified output)
    return module


def batches(vocab: int, rows: int, seq: int):
    """Padded batches: token ids, the attention mask, and next-token targets (-100 where padded)."""
    generator = torch.Generator().manual_seed(0)
    text = torch.randint(vocab, (8 * seq,), generator=generator)
    while True:
        starts = torch.randint(len(text) - seq - 1, (rows,), generator=generator).tolist()
        windows = torch.stack([text[s: s + seq + 1] for s in starts])
        mask = (torch.arange(seq) < torch.randint(seq // 2, seq + 1, (rows, 1), generator=generator)).long()
        yield windows[:, :-1], mask, windows[:, 1:].masked_fill(mask == 0, -100)


def train(args: argparse.Namespace) -> list[float]:
    rank = dist.get_rank()
    pipeline = pipeline_module(args.schedule, dist.get_world_size(), args.microbatches)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(CONFIGS[args.family](args.vocab))
    # the SCHEDULE gives the stage count, and a copy of a tied weight per stage where two chains run (Chimera)
    cut = pipeforge.split(model, pipeline.SCHEDULE, owned=pipeline.stages_of_rank(rank))
    loss_fn = TokenMeanLoss()
    pipe = pipeline.make_pipeline(cut.modules, loss_fn=loss_fn, tied_parameters=cut.tied_parameters,
                                  scale_grads=False, timeout=args.timeout)
    optimizer = torch.optim.AdamW(pipe.parameters(), lr=args.lr)
    history = []
    for step, (tokens, mask, target) in zip(range(args.steps), batches(args.vocab, args.rows, args.seq)):
        inputs = {"target": loss_fn.batch(target) if pipe.holds_last else None,
                  "shared_kwargs": {"attention_mask": mask}}
        if step == 0:
            pipe.check(*((tokens,) if pipe.holds_first else ()), **inputs)
        losses: list = []
        pipe.step(*((tokens,) if pipe.holds_first else ()), losses=losses, **inputs)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if pipe.holds_last:  # the microbatches' losses add up to the batch's token mean
            history.append(sum(loss.item() for loss in losses if loss is not None))
    return history


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--schedule", default="1f1b")
    parser.add_argument("--family", default="llama", choices=sorted(CONFIGS))
    parser.add_argument("--microbatches", type=int, default=4)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--rows", type=int, default=8)
    parser.add_argument("--seq", type=int, default=16)
    parser.add_argument("--vocab", type=int, default=128)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--timeout", type=float, default=120.0)
    args = parser.parse_args(argv)
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
