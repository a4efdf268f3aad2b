"""A Hugging Face Llama whose head stage weighs more than a block, for the loop's plan arm (docs/profile.md).

``pipeforge_layers()`` returns a ``LlamaForCausalLM`` built from a config
(width 256, ``PLAN_LAYERS`` decoder layers, default 8, untied), a batch of
token ids, their next-token targets and the cross-entropy: the LM head's
vocabulary is 32 * WIDTH (32 WIDTH^2 flops a token, a layer about 10 with its
MLP of width 2 * WIDTH), so the last stage carries about three layers' matmuls
beyond its layers, and stage 0 the embedding's gradient (a dense 8192 x 256). ``pipeforge
profile --per-layer`` measures it; ``pipeforge.split`` cuts it where the plan says.
"""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F

WIDTH, HEADS, SEQ, ROWS = 256, 4, 64, 16
VOCAB = 32 * WIDTH


def loss_fn(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.reshape(-1, VOCAB), target.reshape(-1))


def pipeforge_layers() -> dict:
    import transformers as tf

    torch.manual_seed(0)
    config = tf.LlamaConfig(vocab_size=VOCAB, hidden_size=WIDTH, intermediate_size=2 * WIDTH,
                            num_hidden_layers=int(os.environ.get("PLAN_LAYERS", "8")), num_attention_heads=HEADS,
                            num_key_value_heads=HEADS, max_position_embeddings=SEQ, tie_word_embeddings=False,
                            attn_implementation="sdpa")
    model = tf.LlamaForCausalLM(config)
    tokens = torch.randint(0, VOCAB, (ROWS, SEQ + 1))
    return {"model": model, "batch": tokens[:, :-1], "target": tokens[:, 1:], "loss_fn": loss_fn}
