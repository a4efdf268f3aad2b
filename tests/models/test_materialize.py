"""A model built on the meta device: ``split`` materializes the owned stages only, as the whole model has them."""

from __future__ import annotations

import pytest
import torch

import pipeforge
from tests.models import families


def values(module):
    return {name: t for name, t in [*module.named_parameters(), *module.named_buffers()]}


@pytest.mark.parametrize("name", families.FAMILIES + families.WORLD)
def test_owned_stages_get_the_values_of_the_whole_model(name):
    stages = 3
    whole = pipeforge.split(families.build(name, meta=True), stages, seed=7)
    for stage in range(stages):
        mine = pipeforge.split(families.build(name, meta=True), stages, owned=[stage], seed=7)
        assert sorted(mine.modules) == [stage]
        got, want = values(mine.modules[stage]), values(whole.modules[stage])
        assert got.keys() == want.keys()
        for key, tensor in got.items():
            assert not tensor.is_meta, key
            assert torch.equal(tensor, want[key]), f"stage {stage} {key}"


@pytest.mark.parametrize("name", ["llama-tied", "gpt2"])
def test_a_tied_head_on_another_rank_starts_as_the_embedding(name):
    whole = pipeforge.split(families.build(name, meta=True), 2, seed=3)
    last = pipeforge.split(families.build(name, meta=True), 2, owned=[1], seed=3)
    assert torch.equal(last.modules[1].head.weight, whole.modules[0].embed.weight)


def test_only_owned_layers_are_materialized():
    model = families.build("llama", meta=True)
    cut = pipeforge.split(model, 4, owned=[2])
    assert all(not p.is_meta for p in cut.modules[2].parameters())
    assert model.model.layers[0].self_attn.q_proj.weight.is_meta and model.lm_head.weight.is_meta


@pytest.mark.parametrize("name", ["llama", "gpt2", "mixtral"])
def test_the_materialized_whole_model_runs_as_its_stages(name):
    model = families.build(name, meta=True)
    cut = pipeforge.split(model, 2, seed=1)
    tokens, mask, _ = families.batch(name, 2, seed=0)
    hidden = tokens
    for stage in range(2):
        hidden = cut.modules[stage](hidden, attention_mask=mask)
        hidden = getattr(hidden, "output", hidden)
    assert torch.equal(hidden, model(input_ids=tokens, attention_mask=mask).logits)


def test_values_from_a_state_dict():
    source = families.build("llama")
    cut = pipeforge.split(families.build("llama", meta=True), 2, owned=[1], state_dict=source.state_dict())
    assert torch.equal(cut.modules[1].layers["3"].mlp.up_proj.weight, source.model.layers[3].mlp.up_proj.weight)
    assert torch.equal(cut.modules[1].head.weight, source.lm_head.weight)


def test_the_callers_random_state_is_left_alone():
    model = families.build("llama", meta=True)
    state = torch.random.get_rng_state()
    pipeforge.split(model, 2)  # materializes and checks the whole model
    assert torch.equal(torch.random.get_rng_state(), state)


def test_buffers_the_init_does_not_draw_are_the_models_own():
    """The rotary table is computed, not drawn: it equals that of the model built normally."""
    cut = pipeforge.split(families.build("llama", meta=True), 2, owned=[1])
    assert torch.equal(cut.modules[1].rotary.inv_freq, families.build("llama").model.rotary_emb.inv_freq)


def test_values_from_safetensors_shards_read_for_the_owned_stages(tmp_path):
    from safetensors.torch import save_file

    source = families.build("llama-tied")
    state = {k: v.contiguous() for k, v in source.state_dict().items() if k != "lm_head.weight"}  # tied: saved once
    keys = sorted(state)
    save_file({k: state[k] for k in keys[: len(keys) // 2]}, tmp_path / "model-00001-of-00002.safetensors")
    save_file({k: state[k] for k in keys[len(keys) // 2:]}, tmp_path / "model-00002-of-00002.safetensors")
    cut = pipeforge.split(families.build("llama-tied", meta=True), 2, owned=[1], state_dict=tmp_path)
    assert torch.equal(cut.modules[1].head.weight, source.model.embed_tokens.weight)
    got, want = cut.modules[1].layers["2"].self_attn.q_proj.weight, source.model.layers[2].self_attn.q_proj.weight
    assert torch.equal(got, want)
    with pytest.raises(pipeforge.UsageError, match="names no .safetensors file"):
        pipeforge.split(families.build("llama", meta=True), 2, state_dict=tmp_path / "missing")


@pytest.mark.parametrize("name", ["gptj", "gemma3"])
def test_a_meta_model_given_the_state_dict_computes_what_the_model_computes(name):
    """Buffers no state_dict holds (GPT-J's sinusoids, the rotary tables) are made in the model's own precision."""
    model = families.build(name, seed=3)
    loaded = pipeforge.split(families.build(name, meta=True), 2, state_dict=model.state_dict())
    tokens, mask, _ = families.batch(name, 2, seed=0)
    hidden = tokens
    for stage in (0, 1):
        hidden = loaded.modules[stage](hidden, attention_mask=mask)
    assert torch.equal(hidden, model(input_ids=tokens, attention_mask=mask, use_cache=False).logits)
    assert torch.get_default_dtype() == torch.float32  # as the caller had it
