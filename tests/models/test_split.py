"""``pipeforge.split``: the cut stages chained in one process equal the model's own output, bit for bit."""

from __future__ import annotations

import pytest
import torch

import pipeforge
from pipeforge.errors import UsageError
from tests.models import families


def chained(cut, tokens, mask):
    hidden = tokens
    for stage in sorted(cut.modules):
        kwargs = {"attention_mask": mask} if mask is not None else {}
        hidden = cut.modules[stage](hidden, **kwargs)
        hidden = getattr(hidden, "output", hidden)  # a stage's auxiliary loss rides beside its output
        assert isinstance(hidden, torch.Tensor)
    return hidden


def own_output(model, name, tokens, mask):
    if families.takes_mask(name):
        return model(input_ids=tokens, attention_mask=mask, use_cache=False).logits
    return model(tokens)


CHAINS = [(name, stages) for name in families.FAMILIES for stages in (1, 2, 3, 4)] + \
    [(name, stages) for name in families.WORLD for stages in (1, 3)]  # split checks its own cut as well


@pytest.mark.parametrize("name, stages", CHAINS)
def test_chained_stages_equal_the_model_bit_for_bit(name, stages):
    model = families.build(name)
    tokens, mask, _ = families.batch(name, 3, seed=1)
    mask = mask if families.takes_mask(name) else None
    want = own_output(model, name, tokens, mask)
    cut = pipeforge.split(model, stages)
    assert sorted(cut.modules) == list(range(stages))
    assert torch.equal(chained(cut, tokens, mask), want)


@pytest.mark.parametrize("name", ["qwen2", "mistral"])
def test_the_sliding_window_changes_the_output_so_the_chain_test_can_fail(name):
    """Without its window (every layer on the full causal mask) the logits differ: the masks are really per layer."""
    model = families.build(name)
    tokens, mask, _ = families.batch(name, 3, seed=1)
    cut = pipeforge.split(model, 2)
    for module in cut.modules.values():
        module.masks = [{"attention_mask": "full_attention"}] * len(module.masks)
    assert not torch.allclose(chained(cut, tokens, mask), own_output(model, name, tokens, mask))


def test_layers_per_stage_given_or_balanced_from_costs():
    model = families.build("llama")
    assert [list(r) for r in pipeforge.split(model, 2, layers=[3, 1]).layers] == [[0, 1, 2], [3]]
    costs = {"layers": [1, 1, 1, 1], "first": 2.0, "last": 0.0}
    assert [list(r) for r in pipeforge.split(model, 2, costs=costs).layers] == [[0], [1, 2, 3]]
    assert [list(r) for r in pipeforge.split(model, 2).layers] == [[0, 1], [2, 3]]
    with pytest.raises(UsageError, match="summing to the model's 4 layers"):
        pipeforge.split(model, 2, layers=[1, 1])


def test_owned_stages_only():
    cut = pipeforge.split(families.build("gpt2"), 4, owned=[1, 3])
    assert sorted(cut.modules) == [1, 3]
    assert [list(r) for r in cut.layers] == [[0], [1], [2], [3]]


@pytest.mark.parametrize("name", ["llama-tied", "gpt2"])
def test_tied_embedding_and_head_in_stage_relative_names(name):
    cut = pipeforge.split(families.build(name), 3)
    assert cut.tied_parameters == [[(0, "embed.weight"), (2, "head.weight")]]
    assert cut.modules[0].embed.weight is cut.modules[2].head.weight  # one parameter while the model holds one


def test_untied_models_have_no_tied_groups():
    assert pipeforge.split(families.build("llama"), 3).tied_parameters == []


def test_untie_gives_each_stage_its_own_copy_still_tied():
    cut = pipeforge.split(families.build("llama-tied"), 2, untie=True)
    first, last = cut.modules[0].embed.weight, cut.modules[1].head.weight
    assert first is not last and torch.equal(first, last)
    assert cut.tied_parameters == [[(0, "embed.weight"), (1, "head.weight")]]


def test_a_stage_returns_tensors_only_and_the_cache_is_off():
    model = families.build("llama")
    tokens, mask, _ = families.batch("llama", 2, seed=0)
    out = pipeforge.split(model, 2).modules[0](tokens, attention_mask=mask)
    assert isinstance(out, torch.Tensor) and model.config.use_cache is False


def test_a_model_it_cannot_cut_is_refused_by_name():
    with pytest.raises(UsageError, match="one nn.ModuleList"):
        pipeforge.split(torch.nn.Linear(2, 2), 2)


def test_a_tie_the_metadata_declares_is_kept_when_the_copies_are_distinct_parameters():
    model = families.build("llama-tied")
    model.lm_head.weight = torch.nn.Parameter(model.model.embed_tokens.weight.detach().clone())  # as loaded apart
    assert pipeforge.split(model, 2).tied_parameters == [[(0, "embed.weight"), (1, "head.weight")]]


class AddsPositions(families.LayerList):
    """A layer-list model whose forward does more than apply its children in order."""

    def forward(self, x):
        h = self.embed(x)
        h = h + torch.arange(h.shape[-1], dtype=h.dtype)  # along the features: the blocks' LayerNorm keeps it
        for block in self.blocks:
            h = block(h)
        return self.head(h)


def scaled_llama():
    """A Llama whose forward doubles its logits, with no config switch that says so."""
    import transformers as tf

    class ScaledLogits(tf.LlamaForCausalLM):
        def forward(self, *args, **kwargs):
            output = super().forward(*args, **kwargs)
            output.logits = 2 * output.logits
            return output

    torch.manual_seed(0)
    return ScaledLogits(families.config("llama", layers=2)).double()


def llama_without_padding():
    """A Llama whose forward drops the attention mask: only a padded row tells it from the cut."""
    import transformers as tf

    class IgnoresPadding(tf.LlamaForCausalLM):
        def forward(self, input_ids=None, attention_mask=None, **kwargs):
            return super().forward(input_ids=input_ids, **kwargs)

    torch.manual_seed(0)
    return IgnoresPadding(families.config("llama", layers=2)).double()


@pytest.mark.parametrize("build", [scaled_llama, llama_without_padding, lambda: AddsPositions().double()],
                         ids=["hf-subclass", "hf-padding", "layer-list"])
def test_a_model_whose_forward_does_more_than_the_cut_knows_is_refused(build):
    model = build()
    with pytest.raises(UsageError, match="do not compute what its forward computes"):
        pipeforge.split(model, 2)
    assert sorted(pipeforge.split(model, 2, verify=False).modules) == [0, 1]
    assert model.training  # the check left the model's mode as it was


def test_every_tested_family_is_known_as_tested_on_the_meta_device():
    from pipeforge.models.verify_cut import TESTED

    assert {families.config(name).model_type for name in families.HF + families.WORLD} <= TESTED


def test_an_untested_family_on_the_meta_device_is_warned_about():
    import transformers as tf

    config = tf.HeliumConfig(vocab_size=40, hidden_size=16, num_hidden_layers=2, num_attention_heads=4,
                             num_key_value_heads=2, intermediate_size=32, head_dim=4)
    with torch.device("meta"):
        model = tf.AutoModelForCausalLM.from_config(config)
    with pytest.warns(UserWarning, match="HeliumForCausalLM .* is on the meta device"):
        pipeforge.split(model, 2, owned=[1])


@pytest.mark.parametrize("name, shared", [("zbv", True), ("chimera", False)])
def test_given_the_schedule_split_unties_only_where_two_chains_run(name, shared):
    from pipeforge.generator import generate

    module = {}
    exec(compile(generate(pipeforge.load(name, defines={"P": 2, "M": 4})), name, "exec"), module)  # noqa: S102
    schedule = module["SCHEDULE"]
    cut = pipeforge.split(families.build("llama-tied"), schedule, owned=module["stages_of_rank"](0))
    last = schedule.stages - 1
    assert sorted(cut.modules) == [0, last]
    assert (cut.modules[0].embed.weight is cut.modules[last].head.weight) is shared
    assert cut.tied_parameters == [[(0, "embed.weight"), (last, "head.weight")]]


def refused(name):
    import transformers as tf

    small = {"vocab_size": 40, "hidden_size": 16, "num_hidden_layers": 2, "num_attention_heads": 4,
             "intermediate_size": 32, "attn_implementation": "eager"}
    if name == "falcon-alibi":
        return tf.FalconForCausalLM(tf.FalconConfig(**small, alibi=True))
    if name == "mpt":
        return tf.MptForCausalLM(tf.MptConfig(vocab_size=40, d_model=16, n_layers=2, n_heads=4))
    if name == "opt":
        return tf.OPTForCausalLM(tf.OPTConfig(**small, ffn_dim=32, word_embed_proj_dim=16))
    if name == "gemma3-bidirectional":
        return tf.Gemma3ForCausalLM(tf.Gemma3TextConfig(**small, head_dim=4, use_bidirectional_attention=True))
    if name == "gpt2-cross-attention":
        return tf.GPT2LMHeadModel(tf.GPT2Config(vocab_size=40, n_embd=16, n_layer=2, n_head=4, add_cross_attention=True))
    if name == "bert-masked-lm":
        return tf.BertForMaskedLM(tf.BertConfig(**small))
    if name == "bert-encoder-lm":
        return tf.BertLMHeadModel(tf.BertConfig(**small, is_decoder=False))
    if name == "bert-decoder-lm":
        return tf.BertLMHeadModel(tf.BertConfig(**small, is_decoder=True))
    return tf.T5ForConditionalGeneration(tf.T5Config(vocab_size=40, d_model=16, d_ff=32, num_layers=2, num_heads=4,
                                                     d_kv=4))


@pytest.mark.parametrize("name, message", [
    ("falcon-alibi", "FalconForCausalLM: its forward folds ALiBi into the attention mask"),
    ("mpt", r"MptForCausalLM: its layers' MptBlock.forward needs \['position_bias'\]"),
    ("opt", r"OPTForCausalLM: cannot tell its layer list: its base model 'model' holds 0 .*decoder \(OPTDecoder\)"),
    ("gemma3-bidirectional", r"Gemma3ForCausalLM attends both ways \(config.use_bidirectional_attention\)"),
    ("bert-masked-lm", "BertForMaskedLM is not a causal LM .*cuts decoder-only causal LMs"),
    ("bert-encoder-lm", r"BertLMHeadModel: its attention 'bert.encoder.layer.0.attention.self' is not causal"),
    ("gpt2-cross-attention", r"GPT2LMHeadModel: its attention 'transformer.h.0.crossattention' is not causal"),
    ("bert-decoder-lm", r"BertLMHeadModel: cannot tell its layer list: .*encoder \(BertEncoder\)"),
    ("t5", r"T5ForConditionalGeneration is an encoder-decoder model"),
])
def test_a_family_the_cut_does_not_know_is_refused_naming_the_place(name, message):
    with pytest.raises(UsageError, match=message):
        pipeforge.split(refused(name), 2)


def test_a_base_model_not_at_its_prefix_is_the_one_pretrained_child_or_refused():
    """Llama 4's text LM names ``language_model`` as its base_model_prefix but holds its base at ``model``
    (families.WORLD: the chain test cuts it); with two such children neither is guessed."""
    import copy

    llama4 = families.build("llama4")
    assert llama4.base_model_prefix == "language_model" and not hasattr(llama4, "language_model")
    tokens, mask, _ = families.batch("llama4", 2, seed=1)
    cut = pipeforge.split(llama4, 2, seed=0)  # checked against the model's forward, bit for bit
    assert cut.modules[0](tokens, attention_mask=mask) is not None
    llama = families.build("llama")
    llama.base_model_prefix = "nothing"
    assert pipeforge.split(llama, 2, seed=0)  # its one pretrained child, "model"
    llama.add_module("other", copy.deepcopy(llama.model))
    with pytest.raises(UsageError, match=r"no base model at 'nothing' \(its base_model_prefix\), and not one "
                                         r"pretrained model among its children to take for it \('model', 'other'\)"):
        pipeforge.split(llama, 2, seed=0)


def test_each_layer_gets_the_masks_its_type_names_by_its_own_arguments():
    """Falcon-H1's 'hybrid' layers take the causal mask and the Mamba mask (families.WORLD cuts it); Nemotron-H's
    expert and MLP blocks no mask; a layer of a type mapped to several masks that does not take them is refused."""
    from pipeforge.models.hf import layer_masks

    class OneMask(torch.nn.Module):
        def forward(self, hidden, attention_mask=None):
            return hidden

    class TwoMasks(torch.nn.Module):
        def forward(self, hidden, attention_mask=None, mamba_attention_mask=None):
            return hidden

    assert layer_masks("full_attention", OneMask()) == {"attention_mask": "full_attention"}
    assert layer_masks("moe", OneMask()) == {} and layer_masks("mlp", OneMask()) == {}
    assert layer_masks("hybrid", TwoMasks()) == {"attention_mask": "full_attention",
                                                 "mamba_attention_mask": "linear_attention"}
    with pytest.raises(UsageError, match=r"layer 'x': attention type 'hybrid' names no single mask function .*\(it "
                                         r"maps to several: 'full_attention', 'linear_attention'\) and its layer does "
                                         r"not take one attention_mask and one other ..._attention_mask"):
        layer_masks("hybrid", OneMask(), "layer 'x'")
