"""The auxiliary-loss channel: a stage's ``WithAuxLoss`` scalar joins its backward, B and I + W alike."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import pipeforge
from pipeforge.runtime.aux import WithAuxLoss
from pipeforge.runtime.p2p import PipelineError
from pipeforge.runtime.stage import StageRunner
from tests.models import families


class AuxStage(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(4, 4).double()

    def forward(self, x):
        h = self.linear(x)
        return WithAuxLoss(torch.tanh(h), 0.5 * h.pow(2).mean())


def loss_fn(output, target):
    return ((output - target) ** 2).mean()


@pytest.mark.parametrize("last", [False, True])
def test_aux_loss_gradient_as_autograd_gives_it_by_b_and_by_i_then_w(last):
    torch.manual_seed(0)
    module = AuxStage()
    x, target, grad = (torch.randn(3, 4, dtype=torch.float64) for _ in range(3))
    # what autograd gives for the stage's part of the objective: <output, grad> (or the loss) + aux
    reference = copy.deepcopy(module)
    leaf = x.clone().requires_grad_()
    out = reference(leaf)
    objective = (loss_fn(out.output, target) if last else (out.output * grad).sum()) + out.aux_loss
    objective.backward()
    for split in (False, True):
        copied = copy.deepcopy(module)
        runner = StageRunner(copied, stage=1, chain=0, is_first=False, is_last=last, loss_fn=loss_fn if last else None)
        output = runner.forward(0, (x,), target, training=True)
        assert isinstance(output, torch.Tensor)  # the next stage sees the output alone
        grads = None if last else (grad,)
        if split:
            input_grads = runner.backward_input(0, grads)
            runner.backward_weight(0)
        else:
            input_grads = runner.backward(0, grads)
        assert torch.equal(input_grads[0], leaf.grad)
        for mine, theirs in zip(copied.parameters(), reference.parameters()):
            assert torch.allclose(mine.grad, theirs.grad, rtol=1e-14, atol=0)


def test_an_aux_loss_that_is_not_a_scalar_is_refused_by_stage():
    class Bad(nn.Module):
        def forward(self, x):
            return WithAuxLoss(x, x)

    runner = StageRunner(Bad(), stage=2, chain=0, is_first=False, is_last=False)
    with pytest.raises(PipelineError, match="stage 2: WithAuxLoss.aux_loss must be a scalar tensor"):
        runner.forward(0, (torch.randn(2, 2),), None, training=True)


@pytest.mark.parametrize("name", families.MOE)
def test_the_moe_balancing_loss_reaches_the_router_only_through_the_channel(name):
    """Without the auxiliary loss the router's gradient differs: the channel carries something."""
    tokens, mask, _ = families.batch(name, 2, seed=0)

    def router_grad(aux_loss: bool):
        cut = pipeforge.split(families.build(name), 1, aux_loss=aux_loss)
        out = cut.modules[0](tokens, attention_mask=mask)
        logits, aux = (out.output, out.aux_loss) if aux_loss else (out, 0.0)
        (logits.sum() + aux).backward()
        routers = (n for n in dict(cut.modules[0].named_parameters()) if n.endswith(("gate.weight", "router.weight")))
        return cut.modules[0].get_parameter(next(routers)).grad

    with_aux, without = router_grad(True), router_grad(False)
    assert not torch.allclose(with_aux, without)


def test_a_moe_family_without_a_balancing_loss_trains_its_stages_without_one():
    """DeepSeek-V3 records router logits but balances without a loss (its module has no
    load_balancing_loss_func): its stages return their output alone, as its own forward adds no loss
    (before: a TypeError calling None at the first training forward)."""
    import transformers as tf

    config = tf.DeepseekV3Config(vocab_size=40, hidden_size=16, intermediate_size=32, moe_intermediate_size=8,
                                 num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
                                 n_routed_experts=4, num_experts_per_tok=2, n_group=1, topk_group=1,
                                 first_k_dense_replace=0, q_lora_rank=None, kv_lora_rank=8, qk_rope_head_dim=4,
                                 qk_nope_head_dim=4, v_head_dim=4, attn_implementation="eager")
    torch.manual_seed(0)
    model = tf.AutoModelForCausalLM.from_config(config)  # float32: the experts' grouped_mm takes no float64
    cut = pipeforge.split(model, 1)
    stage = cut.modules[0].train()
    tokens = torch.randint(0, 40, (2, 5))
    out = stage(tokens)
    assert isinstance(out, torch.Tensor)
    torch.testing.assert_close(out, model.train()(input_ids=tokens, use_cache=False).logits)


def test_a_moe_stage_none_of_whose_layers_routes_trains_without_a_loss():
    """Jamba cut in 4: stage 0 holds one Mamba layer and no expert layer, so it records no router logits; it
    returns its output alone (before: WithAuxLoss with the float 0.0, refused as no scalar tensor at the first
    training step), and the stages that route still return their loss."""
    cut = pipeforge.split(families.build("jamba"), 4, seed=0)
    tokens, mask, _ = families.batch("jamba", 2, seed=1)
    stages = [cut.modules[stage].train() for stage in range(4)]
    first = stages[0](tokens, attention_mask=mask)
    assert isinstance(first, torch.Tensor)
    second = stages[1](first, attention_mask=mask)
    assert isinstance(second, WithAuxLoss) and isinstance(second.aux_loss, torch.Tensor)
    assert second.aux_loss.requires_grad
