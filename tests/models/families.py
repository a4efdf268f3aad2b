"""Small float64 models of every family ``pipeforge.split`` cuts, built from configs (eager, dropout off).

``build(name, meta=False)`` returns the whole model (on the meta device when
``meta``); ``batch(name, rows, seed)`` a padded batch: token ids, the attention
mask (1 for a token, 0 for right padding) and next-token targets with -100
where padded.
"""

from __future__ import annotations

import torch
from torch import nn

VOCAB, SEQ, WIDTH, LAYERS = 40, 6, 16, 4

HF = ("llama", "llama-tied", "gpt2", "qwen2", "mistral", "mixtral", "qwen2-moe")
PLAIN = ("sequential", "layer-list")
FAMILIES = HF + PLAIN
# more Hugging Face families, each with what sets it apart; the pipeline tests give them a few schedules each
WORLD = ("gemma2",      # final and attention logit soft-capping, alternating sliding window, tied, scaled embeddings
         "gemma3",      # a rotary table per attention type (local and global bases), q/k norms, soft-capping
         "phi3",        # fused qkv and gate-up projections, a sliding window
         "phi",         # embedding dropout, partial rotary, a parallel block, a final LayerNorm with its own name
         "olmo2",       # norms after attention and MLP, q/k norms
         "gpt-neox",    # parallel residual, partial rotary, embedding dropout
         "falcon",      # the new decoder architecture: grouped kv, two parallel LayerNorms, layers that take alibi=None
         "qwen3",       # q/k norms, tied embeddings
         "qwen3-moe",   # experts and the balancing loss
         "cohere",      # logit scale, parallel attention and MLP, a LayerNorm without bias
         "stablelm",    # partial rotary, q/k LayerNorms per head
         "starcoder2",  # a sliding window, biased projections, LayerNorms
         "gptj",        # rotary inside attention from position ids, layers that return tuples
         "bloom",       # ALiBi, a LayerNorm of the embeddings
         "granite",     # embedding, residual, attention and logit multipliers
         "granitemoe",  # Granite's multipliers around experts with the balancing loss
         "olmoe",       # q/k norms over the whole projection, experts and the balancing loss
         "gpt-oss",     # attention sinks, alternating sliding window, a biased router, clamped SwiGLU experts
         "deepseek-v3",  # multi-head latent attention, a first dense layer, grouped routing with shared experts, no aux loss
         "jamba",       # hybrid: Mamba mixers (the mask zeroing padded states) and attention, experts every other layer
         "lfm2",        # hybrid: gated short convolutions and attention by config.layer_types
         "llama4",      # its base model not at its base_model_prefix; experts every other layer, layers without rotary
         "mamba",       # state-space mixers only (the mask zeroing padded states), the forward's float32 logits
         "falcon-mamba",  # Mamba with RMS norms of its B, C and time step
         "mamba2",      # Mamba-2's multi-head state-space mixers, a gated RMS norm
         "falcon-h1",   # hybrid: attention and Mamba in every layer, each with its own mask (attention type 'hybrid')
         "nemotron-h")  # Mamba, attention, expert and MLP blocks, only the mixers given a mask
MOE = ("mixtral", "qwen2-moe", "qwen3-moe", "granitemoe", "olmoe", "gpt-oss", "jamba")


def config(name: str, layers: int = LAYERS):
    import transformers as tf

    common = {"vocab_size": VOCAB, "hidden_size": WIDTH, "num_hidden_layers": layers, "num_attention_heads": 4,
                  "num_key_value_heads": 2, "max_position_embeddings": 4 * SEQ, "intermediate_size": 2 * WIDTH,
                  "attn_implementation": "eager", "experts_implementation": "eager"}
    if name in ("llama", "llama-tied"):
        return tf.LlamaConfig(**common, tie_word_embeddings=name == "llama-tied")
    if name == "gpt2":
        return tf.GPT2Config(vocab_size=VOCAB, n_embd=WIDTH, n_layer=layers, n_head=4, n_positions=4 * SEQ,
                             resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, attn_implementation="eager",
                             bos_token_id=0, eos_token_id=0)
    if name == "qwen2":  # layers 2 and 3 use a sliding window of 3 tokens, picked by their global index
        return tf.Qwen2Config(**common, use_sliding_window=True, sliding_window=3, max_window_layers=2,
                              tie_word_embeddings=False)
    if name == "mistral":
        return tf.MistralConfig(**common, sliding_window=3)
    if name == "mixtral":
        return tf.MixtralConfig(**common, num_local_experts=4, num_experts_per_tok=2, router_aux_loss_coef=0.1)
    if name == "qwen2-moe":
        return tf.Qwen2MoeConfig(**common, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=WIDTH,
                                 shared_expert_intermediate_size=WIDTH, router_aux_loss_coef=0.1,
                                 tie_word_embeddings=False)
    return _world(tf, name, layers, common)


def _world(tf, name: str, layers: int, common: dict):
    no_dropout = {"hidden_dropout": 0.0, "attention_dropout": 0.0}
    if name == "gemma2":
        return tf.Gemma2Config(**common, head_dim=4, sliding_window=3, final_logit_softcapping=5.0,
                               attn_logit_softcapping=4.0, query_pre_attn_scalar=4)
    if name == "gemma3":
        return tf.Gemma3TextConfig(**common, head_dim=4, sliding_window=3, final_logit_softcapping=5.0,
                                   query_pre_attn_scalar=4, sliding_window_pattern=2)
    if name == "phi3":
        return tf.Phi3Config(**common, sliding_window=3, pad_token_id=0)
    if name == "phi":
        return tf.PhiConfig(**common, partial_rotary_factor=0.5)
    if name == "olmo2":
        return tf.Olmo2Config(**common, pad_token_id=0)
    if name == "gpt-neox":
        return tf.GPTNeoXConfig(vocab_size=VOCAB, hidden_size=WIDTH, num_hidden_layers=layers, num_attention_heads=4,
                                intermediate_size=2 * WIDTH, max_position_embeddings=4 * SEQ, rotary_pct=0.5,
                                use_parallel_residual=True, attn_implementation="eager", **no_dropout)
    if name == "falcon":
        return tf.FalconConfig(vocab_size=VOCAB, hidden_size=WIDTH, num_hidden_layers=layers, num_attention_heads=4,
                               num_kv_heads=2, new_decoder_architecture=True, attn_implementation="eager",
                               **no_dropout)
    if name == "qwen3":
        return tf.Qwen3Config(**common, head_dim=4, tie_word_embeddings=True)
    if name == "qwen3-moe":
        return tf.Qwen3MoeConfig(**common, head_dim=4, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=WIDTH,
                                 router_aux_loss_coef=0.1)
    if name == "cohere":
        return tf.CohereConfig(**common, logit_scale=0.5)
    if name == "stablelm":
        return tf.StableLmConfig(**common, partial_rotary_factor=0.25, qk_layernorm=True)
    if name == "starcoder2":
        return tf.Starcoder2Config(**common, sliding_window=3, residual_dropout=0.0, embedding_dropout=0.0)
    if name == "gptj":
        return tf.GPTJConfig(vocab_size=VOCAB, n_embd=WIDTH, n_layer=layers, n_head=4, rotary_dim=2, n_positions=4 * SEQ,
                             resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, attn_implementation="eager",
                             bos_token_id=0, eos_token_id=0)
    if name == "bloom":
        return tf.BloomConfig(vocab_size=VOCAB, hidden_size=WIDTH, n_layer=layers, n_head=4, attn_implementation="eager",
                              **no_dropout)
    if name == "granite":
        return tf.GraniteConfig(**common, embedding_multiplier=2.0, logits_scaling=3.0, residual_multiplier=0.5,
                                attention_multiplier=0.3)
    return _moe_and_hybrid(tf, name, layers, common)


def _moe_and_hybrid(tf, name: str, layers: int, common: dict):
    experts = {"num_experts_per_tok": 2, "router_aux_loss_coef": 0.1}
    if name == "granitemoe":
        return tf.GraniteMoeConfig(**common, **experts, num_local_experts=4, embedding_multiplier=2.0,
                                   logits_scaling=3.0, residual_multiplier=0.5, attention_multiplier=0.3)
    if name == "olmoe":
        return tf.OlmoeConfig(**common, **experts, num_experts=4, pad_token_id=0)
    if name == "gpt-oss":
        return tf.GptOssConfig(**common, **experts, num_local_experts=4, head_dim=4, sliding_window=3)
    if name == "deepseek-v3":  # latent attention wants as many kv heads as heads
        return tf.DeepseekV3Config(**{**common, "num_key_value_heads": 4}, n_routed_experts=4, num_experts_per_tok=2,
                                   moe_intermediate_size=WIDTH, kv_lora_rank=8, q_lora_rank=8, qk_rope_head_dim=2,
                                   qk_nope_head_dim=2, v_head_dim=4, first_k_dense_replace=1, n_group=2, topk_group=1,
                                   n_shared_experts=1)
    if name == "jamba":  # odd layers attend and route to experts, even ones are Mamba mixers with an MLP
        return tf.JambaConfig(**common, **experts, num_experts=4, attn_layer_period=2, attn_layer_offset=1,
                              expert_layer_period=2, expert_layer_offset=1, use_mamba_kernels=False, pad_token_id=0)
    if name == "llama4":  # layers 1 and 3 route to experts (with a shared one); layer 3 has no rotary, attends whole
        return tf.Llama4TextConfig(**common, head_dim=4, intermediate_size_mlp=2 * WIDTH, num_local_experts=4,
                                   num_experts_per_tok=1, interleave_moe_layer_step=2, no_rope_layer_interval=4,
                                   attention_chunk_size=3, pad_token_id=0)
    if name in ("mamba", "falcon-mamba", "mamba2"):  # no attention: the mixers' own sizes
        mixer = {"vocab_size": VOCAB, "hidden_size": WIDTH, "num_hidden_layers": layers, "state_size": 4, "expand": 2,
                 "conv_kernel": 3, "pad_token_id": 0}
        if name == "mamba2":
            return tf.Mamba2Config(**mixer, num_heads=4, head_dim=8, n_groups=1)
        return (tf.MambaConfig if name == "mamba" else tf.FalconMambaConfig)(**mixer)
    if name == "falcon-h1":
        return tf.FalconH1Config(**common, head_dim=4, pad_token_id=0)
    if name == "nemotron-h":  # its blocks' kinds by default: a Mamba mixer, experts, attention, an MLP
        return tf.NemotronHConfig(**common, head_dim=4, n_routed_experts=4, num_experts_per_tok=2,
                                  moe_intermediate_size=WIDTH, moe_shared_expert_intermediate_size=WIDTH, pad_token_id=0)
    if name == "lfm2":
        return tf.Lfm2Config(**common, full_attn_idxs=list(range(1, layers, 2)), pad_token_id=0)
    raise KeyError(name)


class LayerList(nn.Module):
    def __init__(self, layers: int = LAYERS):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.blocks = nn.ModuleList(nn.Sequential(nn.LayerNorm(WIDTH), nn.Linear(WIDTH, WIDTH), nn.Tanh())
                                    for _ in range(layers))
        self.head = nn.Linear(WIDTH, VOCAB)

    def forward(self, x):
        x = self.embed(x)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def _plain(name: str, layers: int) -> nn.Module:
    if name == "layer-list":
        return LayerList(layers)
    return nn.Sequential(nn.Embedding(VOCAB, WIDTH), *[nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.GELU())
                                                       for _ in range(layers)], nn.Linear(WIDTH, VOCAB))


def build(name: str, seed: int = 0, meta: bool = False, layers: int = LAYERS) -> nn.Module:
    torch.manual_seed(seed)
    with torch.device("meta" if meta else "cpu"):
        if name in PLAIN:
            model = _plain(name, layers)
        else:
            from transformers import AutoModelForCausalLM

            model = AutoModelForCausalLM.from_config(config(name, layers), dtype=torch.float64)
    model = model.to(torch.float64)
    model.train()
    return model


def takes_mask(name: str) -> bool:
    return name in HF or name in WORLD


def batch(name: str, rows: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, VOCAB, (rows, SEQ + 1), generator=generator)
    lengths = torch.randint(SEQ - 2, SEQ + 1, (rows,), generator=generator)  # a window of 3 sees a token
    lengths[0] = SEQ
    mask = (torch.arange(SEQ) < lengths[:, None]).long()
    target = tokens[:, 1:].masked_fill(mask == 0, -100)
    return tokens[:, :-1], mask, target
