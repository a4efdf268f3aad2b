"""torch.compile'd stage modules under the library schedules, split backward included.

Compiled plainly, a region is one autograd node (AOTAutograd's ``CompiledFunctionBackward``)
whose backward computes input and weight gradients together, once (its donated buffers forbid
running it again): where a schedule splits the backward of such a graph, I runs the stage's
whole backward and W nothing, and the step trace's I event says so. Compiled with
``split_backend`` (GPT-2 and Llama stage sets, every decoder layer a region), I runs the
regions' input-gradient graphs and W their weight-gradient graphs, and the trace says that.
Gradients equal the eager stages' bit for bit with ``aot_eager`` in float64, and within rounding
with inductor in float32. From a microbatch's I to its W a split region holds only what its weight
graph reads: a GPT-2 and a Llama stage hold no more bytes than the same stage eager under the split
(``benchmarks/runtime/compiled.py``'s ``held_from_i_to_w``), and a backward that needs what I or W
freed fails, naming the region's compile backend, where it would otherwise run on freed values.
"""

from __future__ import annotations

import tempfile

import pytest
import torch

import pipeforge
from pipeforge.generator import codegen
from pipeforge.runtime.split_backward import FUSED_NOTE
from pipeforge.tools.launch import spawn

SCHEDULES = ("1f1b", "zb-h1", "interleaved-zb", "zbv", "dualpipev")
HELD = {"gpt2": 0.85, "llama": 1.0}  # the most a split stage holds from I to W, of the eager split's bytes
MICROBATCHES = 4


def compiled_against_eager(rank: int, nproc: int, paths: dict[str, str]) -> dict[str, float]:
    import copy

    import torch

    from pipeforge.tools.generated import load_module

    torch.set_default_dtype(torch.float64)
    torch._dynamo.config.cache_size_limit = 64  # every stage module of every schedule is compiled once
    found = {}
    for name, path in paths.items():
        module = load_module(path)
        torch.manual_seed(0)
        full = [torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 4))
                for _ in range(module.SCHEDULE.stages)]
        mine = module.stages_of_rank(rank)
        eager = {s: copy.deepcopy(full[s]) for s in mine}
        compiled = {s: torch.compile(copy.deepcopy(full[s]), backend="aot_eager", dynamic=False) for s in mine}
        x = torch.randn(16, 4, generator=torch.Generator().manual_seed(1))
        y = torch.randn(16, 4, generator=torch.Generator().manual_seed(2))
        grads, notes = {}, set()
        for key, stages in (("eager", eager), ("compiled", compiled)):
            pipe = module.make_pipeline(stages, loss_fn=torch.nn.functional.mse_loss, timeout=120)
            pipe.trace = key == "compiled"
            pipe.step(*((x,) if pipe.holds_first else ()), target=y if pipe.holds_last else None)
            grads[key] = [p.grad for s in mine for p in stages[s].parameters()]
            if pipe.trace:
                notes = {e.label for e in pipe.last_trace.events if e.kind == "I" and e.stage != 0}
        assert all(g is not None for g in grads["compiled"]), name
        found[name] = max((a - b).abs().max().item() for a, b in zip(grads["eager"], grads["compiled"]))
        found[f"{name} I notes"] = sorted(notes)
    return found


@pytest.mark.distributed
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_compiled_stages_give_the_eager_gradients_under_every_split_schedule():
    with tempfile.TemporaryDirectory() as out:
        paths = {name: str(codegen(pipeforge.load(name, defines={"P": 2, "M": MICROBATCHES}), f"{out}/{name}"))
                 for name in SCHEDULES}
        outcomes = spawn(compiled_against_eager, 2, paths, timeout=300, deadline=840)
    assert all(o.ok for o in outcomes), "\n".join(o.error for o in outcomes if not o.ok)
    for outcome in outcomes:
        assert {name: outcome.value[name] for name in SCHEDULES} == dict.fromkeys(SCHEDULES, 0.0), outcome.value
    for name in SCHEDULES:  # every split I of a stage with inputs says what it did; 1F1B has none
        notes = sorted({note for outcome in outcomes for note in outcome.value[f"{name} I notes"]})
        assert notes == ([] if name == "1f1b" else [FUSED_NOTE]), (name, notes)


def compiled_stage_sets(rank: int, nproc: int, job: dict) -> dict:
    """GPT-2 or Llama stages with every decoder layer compiled by ``split_backend(job["backend"])``, against
    the same stages eager, one step of every schedule: the largest relative gradient difference, the I labels."""
    import copy

    import torch

    from pipeforge.models import TokenMeanLoss
    from pipeforge.models.compiled import split_backend
    from pipeforge.tools.generated import load_module
    from tests.models import families

    torch.set_num_threads(1)
    torch._dynamo.config.cache_size_limit = 64
    dtype = getattr(torch, job["dtype"])
    found: dict = {}
    for name, path in job["paths"].items():
        module = load_module(path)
        info, mine = module.SCHEDULE, module.stages_of_rank(rank)
        cut = pipeforge.split(families.build(job["family"], layers=max(families.LAYERS, info.stages)).to(dtype),
                              info, owned=mine, seed=5)
        eager = cut.modules
        compiled = copy.deepcopy(eager)
        for stage in compiled.values():
            for key, layer in stage.layers.items():
                stage.layers[key] = torch.compile(layer, backend=split_backend(job["backend"]), dynamic=False)
        tokens, mask, target = families.batch(job["family"], 2 * info.microbatches, seed=1)
        grads, notes = {}, set()
        for key, stages in (("eager", eager), ("compiled", compiled)):
            loss_fn = TokenMeanLoss()
            pipe = module.make_pipeline(stages, loss_fn=loss_fn, tied_parameters=cut.tied_parameters, timeout=300)
            pipe.trace = key == "compiled"
            pipe.step(*((tokens,) if pipe.holds_first else ()), shared_kwargs={"attention_mask": mask},
                      target=loss_fn.batch(target) if pipe.holds_last else None)
            grads[key] = [p.grad for s in mine for p in stages[s].parameters()]
            if pipe.trace:
                notes = {e.label for e in pipe.last_trace.events if e.kind == "I" and e.stage != 0}
        assert all(g is not None for g in grads["compiled"]), name
        found[name] = max(((a - b).abs().max() / b.abs().max().clamp(min=1e-30)).item()
                          for a, b in zip(grads["compiled"], grads["eager"]))
        found[f"{name} I notes"] = sorted(notes)
    return found


# aot_eager in float64: bit for bit (GPT-2; Llama too, 156 s under load, left out of CI); inductor in float32
# within its rounding, both families (256 s and 547 s on the loaded 2-core machine, cold caches)
STAGE_SETS = [("gpt2", "aot_eager", "float64", 0.0), ("gpt2", "inductor", "float32", 1e-4),
              ("llama", "inductor", "float32", 1e-4)]


@pytest.mark.distributed
@pytest.mark.slow
@pytest.mark.timeout(1500)
@pytest.mark.parametrize("family,backend,dtype,tolerance", STAGE_SETS)
def test_compiled_gpt_and_llama_stage_sets_split_around_their_regions(family, backend, dtype, tolerance):
    from pipeforge.runtime.split_backward import SPLIT_NOTE

    with tempfile.TemporaryDirectory() as out:
        paths = {name: str(codegen(pipeforge.load(name, defines={"P": 2, "M": MICROBATCHES}), f"{out}/{name}"))
                 for name in SCHEDULES}
        job = {"paths": paths, "family": family, "backend": backend, "dtype": dtype}
        outcomes = spawn(compiled_stage_sets, 2, job, timeout=600, deadline=1400)
    assert all(o.ok for o in outcomes), "\n".join(o.error for o in outcomes if not o.ok)
    for outcome in outcomes:
        worst = {name: outcome.value[name] for name in SCHEDULES}
        assert all(v <= tolerance for v in worst.values()), worst
    for name in SCHEDULES:
        notes = sorted({note for outcome in outcomes for note in outcome.value[f"{name} I notes"]})
        assert notes == ([] if name == "1f1b" else [SPLIT_NOTE]), (name, notes)


def middle_stage(family: str) -> tuple:
    """The middle stage of ``family`` cut in 3 (float64), its input and mask, and a copy of it with every decoder
    layer compiled by ``split_backend("aot_eager")``."""
    import copy

    from pipeforge.models.compiled import split_backend
    from tests.models import families

    torch._dynamo.config.cache_size_limit = 64
    cut = pipeforge.split(families.build(family), 3, seed=0)
    tokens, mask, _ = families.batch(family, 2, seed=1)
    with torch.no_grad():
        x = cut.modules[0](tokens, attention_mask=mask)
    eager = cut.modules[1]
    compiled = copy.deepcopy(eager)
    for key, layer in compiled.layers.items():
        compiled.layers[key] = torch.compile(layer, backend=split_backend("aot_eager"), dynamic=False)
    return x, mask, eager, compiled


@pytest.mark.parametrize("family", sorted(HELD))
def test_a_compiled_stage_holds_from_i_to_w_no_more_than_the_eager_split(family):
    """The middle stage of the model cut in 3, float64, every decoder layer compiled with aot_eager: the bytes
    alive from I to W (saved, kept, recorded for W) against the eager stage's, the gradients bit for bit; the
    compiling call runs under the measure's saved-tensor hooks (the runtime's counting and offload use them)."""
    from benchmarks.runtime.compiled import held_from_i_to_w

    x, mask, eager, compiled = middle_stage(family)
    found = {}
    for name, stage in (("eager", eager), ("compiled", compiled)):
        held_from_i_to_w(stage, x, {"attention_mask": mask})  # compiles
        found[name] = held_from_i_to_w(stage, x, {"attention_mask": mask})
    (forward, eager_held), (compiled_forward, compiled_held) = found["eager"], found["compiled"]
    assert compiled_forward == forward  # aot_eager saves what eager saves
    assert compiled_held <= HELD[family] * eager_held, (compiled_held, eager_held, forward)
    assert all(torch.equal(a.grad, b.grad) for a, b in zip(eager.parameters(), compiled.parameters()))


def test_a_compiled_falcon_stage_splits_though_its_attention_writes_in_place():
    """Falcon's attention divides and adds into its own values in place: its regions are functionalized and
    split (they were compiled plainly, one fused node: the whole backward at I), gradients bit for bit."""
    from pipeforge.runtime.split_backward import SPLIT_NOTE, SplitBackward, accumulate_weight_gradients

    x, mask, eager, compiled = middle_stage("falcon")
    found = {}
    for name, stage in (("eager", eager), ("compiled", compiled)):
        leaf = x.detach().requires_grad_()
        out = stage(leaf, attention_mask=mask)
        params = [p for p in stage.parameters() if p.requires_grad]
        (dx,), plan = SplitBackward().backward_input((out,), (torch.ones_like(out),), [leaf], params)
        accumulate_weight_gradients(plan)
        found[name] = dx, [p.grad for p in params], plan.note
    (want_dx, want, _), (dx, grads, note) = found["eager"], found["compiled"]
    assert note == SPLIT_NOTE
    assert torch.equal(dx, want_dx) and all(torch.equal(a, b) for a, b in zip(grads, want))


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.norm, self.up, self.down = torch.nn.LayerNorm(4), torch.nn.Linear(4, 8), torch.nn.Linear(8, 4)

    def forward(self, x):
        return x + self.down(torch.tanh(self.up(self.norm(x))))


@pytest.mark.parametrize("again", ["input", "weight", "whole"])
def test_a_backward_through_what_a_split_region_freed_fails_clearly(again):
    """I (the input gradients alone) frees what W does not read, W the rest: a backward after them that needs
    either fails naming split_backend, and I then W gave the eager gradients; a whole backward frees nothing
    (the engine does unless the graph is kept), so one kept graph backs twice, as eager does."""
    import copy

    from pipeforge.models.compiled import split_backend

    torch.manual_seed(0)
    eager = Block().double()
    mine = torch.compile(copy.deepcopy(eager), backend=split_backend("aot_eager"), dynamic=False)
    x, grad = torch.randn(8, 4, dtype=torch.float64, requires_grad=True), torch.randn(8, 4, dtype=torch.float64)
    leaf = x.detach().requires_grad_()
    want = torch.autograd.grad(eager(leaf), (leaf, *eager.parameters()), grad)
    out = mine(x)
    (dx,) = torch.autograd.grad(out, x, grad, retain_graph=True)  # I
    assert torch.equal(dx, want[0])
    if again == "input":  # I again: what the input graph alone read is gone
        with pytest.raises(RuntimeError, match="split_backend ran its input-gradient graph again"):
            torch.autograd.grad(out, x, grad, retain_graph=True)
        return
    weights = torch.autograd.grad(out, tuple(mine.parameters()), grad, retain_graph=True)  # W
    assert all(torch.equal(a, b) for a, b in zip(weights, want[1:]))
    wanted = (x,) if again == "whole" else tuple(mine.parameters())
    with pytest.raises(RuntimeError, match="split_backend ran its input-gradient graph again"):
        torch.autograd.grad(out, wanted, grad, retain_graph=True)
    twice = mine(x)
    for _ in range(2):
        twice.backward(grad, retain_graph=True)
    assert torch.equal(x.grad, 2 * want[0])


@pytest.mark.parametrize("hooks", ["save_on_cpu", "counted"])
def test_a_region_whose_output_is_saved_splits_under_saved_tensor_hooks(hooks):
    """The region's first call (its trace) and its I and W under torch's save_on_cpu and the runtime's counting
    hooks (which read a tensor's data: a fake tensor has none), its output saved (tanh's backward reads it)."""
    import copy

    from pipeforge.models.compiled import split_backend
    from pipeforge.runtime.saved import SavedBytes, counted
    from pipeforge.runtime.split_backward import SplitBackward, accumulate_weight_gradients

    torch.manual_seed(0)
    eager = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Tanh()).double()
    mine = torch.compile(copy.deepcopy(eager), backend=split_backend("aot_eager"), dynamic=False)
    x, grad = torch.randn(8, 4, dtype=torch.float64, requires_grad=True), torch.randn(8, 4, dtype=torch.float64)
    leaf = x.detach().requires_grad_()
    want = torch.autograd.grad(eager(leaf), (leaf, *eager.parameters()), grad)
    counter = SavedBytes()
    params = list(mine.parameters())
    with (torch.autograd.graph.save_on_cpu() if hooks == "save_on_cpu" else
          counted(counter, {p.untyped_storage().data_ptr() for p in params})):
        out = mine(x)
    (dx,), plan = SplitBackward().backward_input((out,), (grad,), [x], params)
    accumulate_weight_gradients(plan)
    assert torch.equal(dx, want[0]) and all(torch.equal(p.grad, w) for p, w in zip(params, want[1:]))
    del out, plan
    assert counter.held == 0
