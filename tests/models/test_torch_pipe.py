"""torch ``pipeline()`` splits through ``pipeforge.split``: the cut, its ties, its refusals, and training on gloo.

In one process: the stage modules cut from a torch ``Pipe`` (GPT-2 with sdpa
and with eager attention, a hand-written Llama, a model whose head reads the
embedding) chained give the model's own output bit for bit at 1 to 4 stages;
values a later stage needs ride through the stages between; torch's replicated
tied weight is the ``tied_parameters`` group. On 4 and 2 gloo ranks
(``torch_pipe_jobs``): losses, every gradient after each of two steps, every
parameter after two SGD steps and eval's outputs then equal torch's own runtime
on the same split (where torch runs it) bit for bit and the unpipelined model
to rounding; the slow tier runs every library schedule with GPT-2.
"""

from __future__ import annotations

import copy

import pytest
import torch

import pipeforge
from pipeforge.errors import UsageError
from pipeforge.generator import codegen
from pipeforge.library import names
from pipeforge.tools.launch import spawn
from tests.models import torch_pipe_jobs as jobs
from tests.models.torch_pipe_jobs import Case

ROUNDING = 1e-12
FAMILIES = ("gpt2", "gpt2-eager", "tiny-llama", "long-skip")


def chained(cut, tokens):
    value = tokens
    for stage in sorted(cut.modules):
        value = cut.modules[stage](*(value if isinstance(value, tuple) else (value,)))
    return value


def own_output(model, tokens):
    output = model(tokens)
    return getattr(output, "logits", output)


@pytest.mark.parametrize("family, stages", [(f, s) for f in FAMILIES for s in (2, 4)] + [("gpt2", 1), ("gpt2", 3)])
def test_chained_stages_give_the_models_output_bit_for_bit(family, stages):
    model = jobs.build(family)
    cut = pipeforge.split(jobs.torch_pipe(copy.deepcopy(model), family, stages), stages)
    tokens = torch.randint(0, jobs.VOCAB, (jobs.ROWS, jobs.SEQ), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert torch.equal(chained(cut, tokens), own_output(model, tokens))
    assert sorted(cut.modules) == list(range(stages))


def test_a_pipe_traced_in_training_mode_keeps_its_dropout_and_is_cut():
    from torch.distributed.pipelining import SplitPoint, pipeline
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=jobs.VOCAB, n_embd=jobs.WIDTH, n_layer=2, n_head=4,
                                       bos_token_id=0, eos_token_id=0, use_cache=False)).train()  # dropout 0.1
    tokens = torch.zeros(jobs.ROWS, jobs.SEQ, dtype=torch.long)
    pipe = pipeline(model, (tokens,), split_spec={"transformer.h.1": SplitPoint.BEGINNING})
    cut = pipeforge.split(pipe, 2)  # its check runs the Pipe and the stages from one random state
    with torch.no_grad():
        assert not torch.equal(chained(cut, tokens), chained(cut, tokens))  # other masks each time


def test_values_for_later_stages_ride_through_the_stages_between():
    cut = pipeforge.split(jobs.torch_pipe(jobs.build("gpt2"), "gpt2", 4), 4)
    tokens = torch.zeros(jobs.ROWS, jobs.SEQ, dtype=torch.long)
    with torch.no_grad():
        out0 = cut.modules[0](tokens)
        out1 = cut.modules[1](*out0)
    mask = next(t for t in out0 if t.dtype == torch.bool)  # made once on stage 0, used by every block
    assert any(t is mask for t in out1), "stage 1 hands stage 0's mask on unchanged"
    assert len(out1) == 2 and out1[1].dtype == torch.float64


def test_a_model_input_a_later_stage_reads_rides_from_stage_0():
    model = jobs.build("late-input")
    cut = pipeforge.split(jobs.torch_pipe(copy.deepcopy(model), "late-input", 4), 4)
    tokens, extra, _ = jobs.batch("late-input", 1, 0)
    assert "scale" in cut.modules[2].meta["pipeforge_inputs"]
    with torch.no_grad():
        value = cut.modules[0](tokens, **extra)  # stage 0 takes every input of the model, by name too
        for stage in (1, 2, 3):
            value = cut.modules[stage](*(value if isinstance(value, tuple) else (value,)))
        assert torch.equal(value, model(tokens, **extra))


def test_a_padding_mask_traced_as_a_keyword_is_given_to_stage_0_by_name():
    from torch.distributed.pipelining import SplitPoint, pipeline

    model = jobs.build("gpt2")
    tokens = torch.randint(0, jobs.VOCAB, (jobs.ROWS, jobs.SEQ), generator=torch.Generator().manual_seed(2))
    traced = torch.tensor([[1] * jobs.SEQ, [1] * 4 + [0] * (jobs.SEQ - 4)])
    pipe = pipeline(copy.deepcopy(model), (tokens,), {"attention_mask": traced},
                    split_spec={f"transformer.h.{i}": SplitPoint.BEGINNING for i in (1, 2, 3)})
    cut = pipeforge.split(pipe, 4)
    for mask in (traced, traced.flip(0)):  # the values may differ from the trace's, the shape not
        with torch.no_grad():
            value = cut.modules[0](tokens, attention_mask=mask)
            for stage in (1, 2, 3):
                value = cut.modules[stage](*value) if isinstance(value, tuple) else cut.modules[stage](value)
            assert torch.equal(value, model(tokens, attention_mask=mask).logits)


def test_the_tied_embedding_and_head_are_one_group_under_the_models_names():
    model = jobs.build("gpt2")
    cut = pipeforge.split(jobs.torch_pipe(copy.deepcopy(model), "gpt2", 4), 4, owned=[0, 3])
    assert cut.tied_parameters == [[(0, "transformer.wte.weight"), (3, "lm_head.weight")]]
    assert sorted(cut.modules) == [0, 3]
    names = dict(model.named_parameters(remove_duplicate=False))
    for (stage, name), model_name in cut.names.items():
        assert model_name == name and torch.equal(cut.modules[stage].get_parameter(name), names[name])
    assert cut.modules[0].get_parameter("transformer.wte.weight") is not cut.modules[3].get_parameter("lm_head.weight")


def test_stages_a_rank_does_not_own_go_with_the_pipe():
    import gc
    import weakref

    pipe = jobs.torch_pipe(jobs.build("gpt2"), "gpt2", 4)
    other = weakref.ref(pipe.get_stage_module(2).get_parameter("transformer.h.2.attn.c_attn.weight"))
    cut = pipeforge.split(pipe, 4, owned=[0])
    del pipe
    gc.collect()
    assert other() is None and sorted(cut.modules) == [0]


def test_a_generated_modules_schedule_gives_the_stage_count(tmp_path):
    from pipeforge.tools.generated import load_module

    generated = load_module(str(codegen(pipeforge.load("zbv", defines={"P": 2, "M": 4}), tmp_path)))
    pipe = jobs.torch_pipe(jobs.build("gpt2"), "gpt2", generated.SCHEDULE.stages)
    cut = pipeforge.split(pipe, generated.SCHEDULE, owned=generated.stages_of_rank(0))
    assert sorted(cut.modules) == [0, 3] and cut.tied_parameters


def test_a_microbatch_of_another_shape_is_refused_naming_the_argument():
    cut = pipeforge.split(jobs.torch_pipe(jobs.build("gpt2"), "gpt2", 2), 2)
    with pytest.raises(UsageError, match=r"stage 0 argument 'input_ids': a microbatch of shape \(4, 6\).*\(2, 6\)"):
        cut.modules[0](torch.zeros(2 * jobs.ROWS, jobs.SEQ, dtype=torch.long))


@pytest.mark.parametrize("options, message", [
    ({"stages": 2}, "the torch Pipe has 4 stages, and stages=2"),
    ({"stages": 4, "layers": [1, 1, 1, 1]}, "layers, costs and state_dict do not apply"),
])
def test_what_a_pipe_cannot_take_is_refused(options, message):
    pipe = jobs.torch_pipe(jobs.build("gpt2"), "gpt2", 4)
    stages = options.pop("stages")
    with pytest.raises(UsageError, match=message):
        pipeforge.split(pipe, stages, **options)


class TwoOutputs(jobs.LongSkip):
    def forward(self, tokens):
        first = h = self.embed(tokens)
        for layer in self.layers:
            h = layer(h)
        return self.head(h), first


def test_a_model_output_made_before_the_last_stage_is_refused_naming_its_stage():
    from torch.distributed.pipelining import SplitPoint, pipeline

    model = TwoOutputs().to(torch.float64)
    pipe = pipeline(model, (torch.zeros(jobs.ROWS, jobs.SEQ, dtype=torch.long),),
                    split_spec={"layers.2": SplitPoint.BEGINNING})
    with pytest.raises(UsageError, match=r"the model's output holds output\[1\] of stage 0, not computed by the "
                                         r"last stage \(1\)"):
        pipeforge.split(pipe, 2)


def test_a_pipe_that_torch_itself_split_wrong_is_refused_before_training():
    """HF Llama through torch 2.13's pipeline(): its rotary, run under no_grad, is outlined into a module torch
    then calls without its inputs; torch's own Pipe fails, and split says so instead of a rank failing later."""
    from tests.models import families

    model = families.build("llama")
    model.config.use_cache = False
    from torch.distributed.pipelining import SplitPoint, pipeline

    pipe = pipeline(model, (torch.zeros(2, families.SEQ, dtype=torch.long),),
                    split_spec={"model.layers.2": SplitPoint.BEGINNING})
    with pytest.raises(UsageError, match="the torch Pipe itself fails"):
        pipeforge.split(pipe, 2)


# --- on gloo ranks -------------------------------------------------------------------------------------------

# (schedule, family, torch's schedule class or None where torch's runtime refuses the split)
FOUR_RANKS = [("1f1b", "gpt2", "Schedule1F1B"), ("gpipe", "gpt2", "ScheduleGPipe"),
              # torch's zero-bubble runtime (PipelineScheduleMulti) refuses a stage receiving from two stages;
              # ZB-H1 is compared with torch's 1F1B, the same sums in another order
              ("zb-h1", "gpt2", "Schedule1F1B"),
              ("1f1b", "gpt2-eager", None),  # a float mask to three stages: torch "Backward of skip connections"
              ("1f1b", "tiny-llama", None), ("zb-h1", "long-skip", None), ("1f1b", "late-input", None)]
TWO_RANKS = [("1f1b", "gpt2", "Schedule1F1B"), ("gpipe", "gpt2", "ScheduleGPipe"),
             ("zb-h1", "gpt2", "ScheduleInterleavedZeroBubble"), ("1f1b", "tiny-llama", "Schedule1F1B"),
             ("interleaved-1f1b", "gpt2", None), ("zbv", "gpt2", None),  # 4 stages on 2 ranks: skips
             ("zbv", "tiny-llama", None), ("interleaved-zb", "long-skip", None)]


def cases(ranks: int, out_dir, every: bool = False) -> list[Case]:
    """The representative set, or (``every``) every library schedule with GPT-2, compared with unpipelined."""
    chosen = [(name, "gpt2", None) for name in names()] if every else FOUR_RANKS if ranks == 4 else TWO_RANKS
    found = []
    for name, family, torch_schedule in chosen:
        path = str(codegen(load(name, ranks), out_dir / name))
        found.append(Case(f"{name} {family}", family, path, torch_schedule))
    return found


def load(name: str, ranks: int):
    for microbatches in (4, 2 * ranks):
        try:
            return pipeforge.load(name, defines={"P": ranks, "M": microbatches})
        except pipeforge.SemanticError:
            continue
    raise AssertionError(f"{name} accepts neither M=4 nor M={2 * ranks}")


@pytest.mark.distributed
@pytest.mark.timeout(900)
@pytest.mark.parametrize("ranks", [4, 2])
def test_pipe_splits_train_as_torchs_runtime_and_the_unpipelined_model(ranks, tmp_path):
    assert_as_torch_and_unpipelined(ranks, cases(ranks, tmp_path), deadline=800)


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.timeout(1500)
@pytest.mark.parametrize("ranks", [4, 2])
def test_every_library_schedule_trains_a_gpt2_pipe_as_the_unpipelined_model(ranks, tmp_path):
    assert_as_torch_and_unpipelined(ranks, cases(ranks, tmp_path, every=True), deadline=1400)


def assert_as_torch_and_unpipelined(ranks: int, chosen: list[Case], deadline: float) -> None:
    outcomes = spawn("tests.models.torch_pipe_jobs:run_cases", ranks, chosen, timeout=120, deadline=deadline)
    assert all(o.ok for o in outcomes), "\n".join(o.error for o in outcomes if not o.ok)
    failures = []
    for i, case in enumerate(chosen):
        for against, limit in (("torch", 0.0), ("unpipelined", ROUNDING)):
            reports = [o.value[i][against] for o in outcomes]
            worst = max(reports, key=lambda r: r["max_rel"])
            if worst["max_rel"] > limit:
                failures.append(f"{case.label} against {against}: {worst['max_rel']:.3g} (largest at "
                                f"{worst['worst']}, rank {worst['rank']})")
            expected = against == "unpipelined" or case.torch_schedule is not None
            if any((r["compared"] > 0) != expected for r in reports):
                failures.append(f"{case.label}: compared with {against} on some ranks only, or unexpectedly")
            failures += [f"{case.label}: missing {m} against {against}" for r in reports for m in r["missing"]]
    assert not failures, "\n".join(failures)


@pytest.mark.distributed
@pytest.mark.timeout(300)
def test_a_microbatch_of_another_shape_fails_every_rank_at_once_naming_stage_and_argument(tmp_path):
    path = str(codegen(pipeforge.load("1f1b", defines={"P": 2, "M": 2}), tmp_path / "1f1b"))
    outcomes = spawn("tests.models.torch_pipe_jobs:wrong_shape", 2, path, timeout=90, deadline=240)
    assert all(o.ok for o in outcomes), "\n".join(o.error for o in outcomes if not o.ok)
    for outcome in outcomes:
        found = outcome.value
        assert found["error"] is not None, f"rank {outcome.rank} stepped"
        assert "stage 0" in found["message"] and "'input_ids'" in found["message"], found["message"]
        assert "traced with shape (2, 6)" in found["message"], found["message"]
        assert found["seconds"] < 50, f"rank {outcome.rank} waited {found['seconds']:.0f} s (the timeout is 60)"
