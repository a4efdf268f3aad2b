"""Compiled stages against eager ones: the step time, how much of the backward W gets, the bytes held to W.

    python -m benchmarks.runtime.compiled                                  # GPT-2, zb-h1 and zbv, 2 ranks
    python -m benchmarks.runtime.compiled --family llama --schedules 1f1b,zbv --rounds 10 --width 64
    python -m benchmarks.runtime.compiled --family llama --held-only --backend aot_eager

On every rank the stages of a small Hugging Face model (``--family gpt2`` or ``llama``, width
``--width``, ``--layers`` layers, sequences of ``--seq`` tokens, ``--rows`` rows a microbatch,
float32, dropout off) are built three times from one seed: ``eager``; ``fused``, every decoder
layer ``torch.compile``'d with inductor (one ``CompiledFunctionBackward`` node a layer: I runs
the whole backward); ``split``, every layer compiled with ``split_backend("inductor")``
(``pipeforge.models.compiled``: input-gradient graphs at I, weight-gradient graphs at W). Each
side runs two steps to compile, then ``--rounds`` rounds of one step each, the sides' order
rotating from round to round, every step after a barrier. Reported per schedule and side: the
median step time of the slowest rank (wall), its ratio to eager (the median of the per-round
ratios), the share of the backward time that W took on the stages after the first (step trace; B where it has
no split), and the first step's largest relative gradient difference from eager.
On the shared 2-core machine these are numbers measured under load: compare ratios, not times.

A second table (bytes, which do not depend on the load; one process): the middle and the last stage
of the model cut in 3, one microbatch, eager and ``split`` each run I then W as the runtime does
(``SplitBackward``): what the forward saves, and what is alive from I to W (``held_from_i_to_w``:
saved tensors I did not free, the regions' kept values, the gradients I recorded for W, each tensor
once, parameters excepted), split against eager. ``--backend`` compiles both compiled sides.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import tempfile
import weakref

import pipeforge
from pipeforge.generator import codegen
from pipeforge.runtime.split_backward import Releasable
from pipeforge.tools.launch import spawn

SIDES = ("eager", "fused", "split")


def build(job: dict):
    import torch
    import transformers as tf

    width, layers = job["width"], job["layers"]
    if job["family"] == "gpt2":
        config = tf.GPT2Config(vocab_size=job["vocab"], n_embd=width, n_layer=layers, n_head=4,
                               n_positions=job["seq"], resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                               attn_implementation="eager", bos_token_id=0, eos_token_id=0)
    else:
        config = tf.LlamaConfig(vocab_size=job["vocab"], hidden_size=width, num_hidden_layers=layers,
                                num_attention_heads=4, num_key_value_heads=2, intermediate_size=4 * width,
                                max_position_embeddings=job["seq"], attn_implementation="eager")
    torch.manual_seed(0)
    return tf.AutoModelForCausalLM.from_config(config, dtype=torch.float32).train()


def compiled_side(stages: dict, backend) -> dict:
    import copy

    stages = copy.deepcopy(stages)
    for stage in stages.values():
        for layer in stage.layers.values():  # in place, the torchtitan way
            layer.compile(backend=backend, dynamic=False)
    return stages


class _Held(Releasable):
    """A saved tensor as ``held_from_i_to_w``'s hooks keep it: I frees it (``split_backward.free_saved``)."""

    __slots__ = ("__weakref__", "tensor")

    def __init__(self, tensor) -> None:
        self.tensor = tensor

    def free(self) -> None:
        self.tensor = None


def held_from_i_to_w(stage, x, kwargs: dict, loss=None) -> tuple[int, int]:
    """(forward, held): the bytes one microbatch's forward of ``stage`` saves, and the bytes alive from its I
    to its W (``SplitBackward``): saved tensors I did not free, the kept values of ``split_backend`` regions,
    the gradients I recorded for W; each tensor once (``saved_key``), parameters excepted. ``loss(out)``
    gives a last stage's root. W then runs, and nothing saved may outlive it."""
    import torch

    from pipeforge.runtime.saved import saved_key
    from pipeforge.runtime.split_backward import REGION_NODE, SplitBackward, accumulate_weight_gradients, walk

    params = [p for p in stage.parameters() if p.requires_grad]
    storages = {p.untyped_storage().data_ptr() for p in params}
    alive: weakref.WeakSet[_Held] = weakref.WeakSet()

    def pack(tensor):
        if tensor.untyped_storage().data_ptr() in storages:
            return tensor
        held = _Held(tensor.detach())
        alive.add(held)
        return held

    def unpack(packed):
        if isinstance(packed, _Held):
            if packed.tensor is None:
                raise RuntimeError("held_from_i_to_w: a saved tensor that I freed was used again")
            return packed.tensor
        return packed

    def counted(tensors) -> int:
        return sum(key[1] for key in {saved_key(t) for t in tensors} - {None})

    x = x.detach().requires_grad_()
    with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
        root = stage(x, **kwargs)
        root = root if loss is None else loss(root)
    forward = counted(h.tensor for h in alive)
    _, plan = SplitBackward().backward_input((root,), (torch.ones_like(root),), [x], params)
    kept = [t for node in walk([root.grad_fn]).nodes if type(node).__name__ == REGION_NODE
            for t in node.kept or ()]
    recorded = [g for group in plan.groups for grads in group.grads.values() for g in grads if g is not None]
    held = counted([*(h.tensor for h in alive if h.tensor is not None), *kept, *recorded])
    accumulate_weight_gradients(plan)
    del root, plan, kept, recorded
    gc.collect()
    left = counted(h.tensor for h in alive if h.tensor is not None)
    if left:
        raise RuntimeError(f"held_from_i_to_w: {left} bytes still saved after W")
    return forward, held


def held_table(job: dict, backend: str) -> list[tuple[int, int, int, int, int]]:
    """(stage, eager forward, eager held, split forward, split held) of the middle and the last stage."""
    import torch

    from pipeforge.models.compiled import split_backend

    torch._dynamo.config.cache_size_limit = 64
    cut = pipeforge.split(build(job), 3, seed=0)
    generator = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, job["vocab"], (job["rows"], job["seq"] + 1), generator=generator)
    inputs, target = [tokens[:, :-1]], tokens[:, 1:]
    with torch.no_grad():
        for before in (0, 1):
            inputs.append(cut.modules[before](inputs[-1]))

    def loss(out):
        return torch.nn.functional.cross_entropy(out.flatten(0, 1), target.flatten())

    rows = []
    for stage in (1, 2):
        eager = cut.modules[stage]
        found: list[int] = []
        for side in (eager, compiled_side({stage: eager}, split_backend(backend))[stage]):
            held_from_i_to_w(side, inputs[stage], {}, loss if stage == 2 else None)  # compiles
            found += held_from_i_to_w(side, inputs[stage], {}, loss if stage == 2 else None)
        rows.append((stage, found[0], found[1], found[2], found[3]))
    return rows


def worker(rank: int, nproc: int, job: dict) -> dict:
    import time

    import torch
    import torch.distributed as dist

    from pipeforge.models import TokenMeanLoss
    from pipeforge.models.compiled import split_backend
    from pipeforge.tools.generated import load_module

    torch.set_num_threads(1)
    torch._dynamo.config.cache_size_limit = 64
    module = load_module(job["path"])
    info, mine = module.SCHEDULE, module.stages_of_rank(rank)
    cut = pipeforge.split(build(job), info, owned=mine, seed=0)
    sides = {"eager": cut.modules, "fused": compiled_side(cut.modules, job["backend"]),
             "split": compiled_side(cut.modules, split_backend(job["backend"]))}
    generator = torch.Generator().manual_seed(1)
    rows = job["rows"] * info.microbatches
    tokens = torch.randint(0, job["vocab"], (rows, job["seq"] + 1), generator=generator)
    x, target = tokens[:, :-1], tokens[:, 1:]
    pipes, losses = {}, {}
    for side, stages in sides.items():
        losses[side] = TokenMeanLoss()
        pipes[side] = module.make_pipeline(stages, loss_fn=losses[side], tied_parameters=cut.tied_parameters,
                                           timeout=1800)

    def step(side: str) -> float:
        pipe = pipes[side]
        for p in pipe.parameters():
            p.grad = None
        dist.barrier()
        started = time.perf_counter()
        pipe.step(*((x,) if pipe.holds_first else ()), target=losses[side].batch(target) if pipe.holds_last else None)
        return time.perf_counter() - started

    record: dict = {side: [] for side in SIDES}
    for side in SIDES:  # compile (and the first step's shapes) outside the timing
        step(side)
        grads = [p.grad for p in pipes[side].parameters()]
        record[f"{side} grads"] = grads
        step(side)
    eager = record["eager grads"]
    for side in SIDES:
        got = record.pop(f"{side} grads")
        record[f"{side} diff"] = max(((a - b).abs().max() / b.abs().max().clamp(min=1e-30)).item()
                                     for a, b in zip(got, eager) if a is not None and b is not None)
    for round_ in range(job["rounds"]):
        order = SIDES[round_ % 3:] + SIDES[:round_ % 3]
        for side in order:
            pipes[side].trace = round_ == job["rounds"] - 1
            record[side].append(step(side))
    for side in SIDES:
        events = pipes[side].last_trace.events
        spent = {k: sum(e.end - e.start for e in events if e.kind == k and e.stage != 0)  # stage 0: no I
                 for k in ("B", "I", "W")}
        record[f"{side} W share"] = spent["W"] / max(spent["I"] + spent["W"] + spent["B"], 1e-12)
    return record


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--family", choices=("gpt2", "llama"), default="gpt2")
    parser.add_argument("--schedules", default="zb-h1,zbv", help="library schedules, comma-separated")
    parser.add_argument("--microbatches", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--seq", type=int, default=32)
    parser.add_argument("--rows", type=int, default=2)
    parser.add_argument("--backend", default="inductor", help="what compiles the fused and split sides")
    parser.add_argument("--held-only", action="store_true", help="only the bytes held from I to W")
    args = parser.parse_args(argv)
    print(f"{args.family} width {args.width}, {args.layers} layers, {args.seq} tokens x {args.rows} rows a "
          f"microbatch, M={args.microbatches}, 2 ranks, {args.rounds} rounds (float32, {args.backend})")
    shape = {"family": args.family, "width": args.width, "layers": args.layers, "seq": args.seq,
             "rows": args.rows, "vocab": 128}
    if not args.held_only and steps(args, shape) != 0:
        return 1
    print(f"\nbytes held from I to W of one microbatch (of what its forward saved), the model cut in 3, "
          f"split: {args.backend}")
    print(f"{'stage':<8}{'eager fwd':>11}{'eager held':>12}{'/ fwd':>7}{'split fwd':>11}{'split held':>12}"
          f"{'/ fwd':>7}{'split/eager':>13}")
    for stage, eager_fwd, eager_held, split_fwd, split_held in held_table(shape, args.backend):
        print(f"{stage:<8}{eager_fwd:>11}{eager_held:>12}{eager_held / eager_fwd:>7.3f}{split_fwd:>11}"
              f"{split_held:>12}{split_held / split_fwd:>7.3f}{split_held / eager_held:>13.3f}")
    return 0


def steps(args, shape: dict) -> int:
    """The step-time table (two gloo processes a schedule); 1 where a rank failed."""
    print(f"{'schedule':<16}{'side':<8}{'step ms':>10}{'vs eager':>10}{'W share':>10}{'grad diff':>12}")
    with tempfile.TemporaryDirectory() as out:
        for name in args.schedules.split(","):
            path = str(codegen(pipeforge.load(name, defines={"P": 2, "M": args.microbatches}), f"{out}/{name}"))
            job = {**shape, "path": path, "rounds": args.rounds, "backend": args.backend}
            outcomes = spawn(worker, 2, job, timeout=1800, deadline=3600)
            failed = [o.error for o in outcomes if not o.ok]
            if failed:
                print("\n".join(failed), file=sys.stderr)
                return 1
            records = [o.value for o in outcomes]
            slowest = {side: [max(r[side][i] for r in records) for i in range(args.rounds)] for side in SIDES}
            for side in SIDES:
                ratio = statistics.median(s / e for s, e in zip(slowest[side], slowest["eager"]))
                share = max(r[f"{side} W share"] for r in records)
                diff = max(r[f"{side} diff"] for r in records)
                print(f"{name:<16}{side:<8}{1e3 * statistics.median(slowest[side]):>10.1f}{ratio:>10.2f}"
                      f"{share:>10.2f}{diff:>12.1e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
