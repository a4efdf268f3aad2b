"""Pipeline x data parallel on 4 gloo ranks: 2 pipelines of 2 ranks, each pipeline rank replicated twice.

World ranks 0, 1 run pipeline replica 0 (pipeline ranks 0, 1), ranks 2, 3 run
replica 1; the data-parallel groups are {0, 2} and {1, 3}. Each replica gets
its own part of the batch. The reference is the unpipelined model run on every
replica's batch (microbatches in order, each replica's gradients divided by the
microbatch count) with the replicas' gradients averaged, as FSDP's
reduce-scatter and DDP average them.

Modes: ``fsdp`` (``make_pipeline(fsdp=True, dp_group=...)``), ``fsdp-user``
(the user shards every Linear and the stage with ``fully_shard``, default
``reshard_after_forward``), ``replicate`` (FSDP2's ``replicate``, no sharding),
``dp`` (plain modules, ``dp_group``: all-reduce).
"""

from __future__ import annotations

import copy

import torch

PIPELINE_RANKS = 2
REPLICAS = 2
TOLERANCE = 1e-12


def groups(rank: int):
    import torch.distributed as dist

    pipelines = [dist.new_group([0, 1]), dist.new_group([2, 3])]
    replicas = [dist.new_group([0, 2]), dist.new_group([1, 3])]
    return pipelines[rank // PIPELINE_RANKS], replicas[rank % PIPELINE_RANKS]


def shard_by_hand(module: torch.nn.Module, dp_group) -> torch.nn.Module:
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import fully_shard

    mesh = DeviceMesh.from_group(dp_group, device_type="cpu")
    for sub in module.modules():
        if isinstance(sub, torch.nn.Linear):
            fully_shard(sub, mesh=mesh)
    return fully_shard(module, mesh=mesh)


def replicate_by_hand(module: torch.nn.Module, dp_group) -> torch.nn.Module:
    from torch.distributed._composable.replicate_with_fsdp import replicate
    from torch.distributed.device_mesh import DeviceMesh

    return replicate(module, mesh=DeviceMesh.from_group(dp_group, device_type="cpu"))


def full(tensor):
    return tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor


def reference_step(stages, batches, microbatches: int) -> list:
    """Losses of every replica's microbatches; grads averaged over replicas, as data parallelism does."""
    from pipeforge.tools import demo_models as models
    from pipeforge.runtime.microbatch import split_value

    losses = []
    for x, y in batches:
        for xm, ym in zip(split_value(x, microbatches), split_value(y, microbatches)):
            loss = models.loss_fn(models.run_stages(stages, xm), ym)
            loss.backward()
            losses.append(loss.detach())
    for param in (p for s in stages for p in s.parameters()):
        param.grad.div_(microbatches * len(batches))
    return losses


def replicated_job(rank: int, job: dict, pipeline_group, dp_group) -> dict:
    import torch.distributed as dist

    from pipeforge.tools import demo_models as models
    from pipeforge.tools.generated import load_module
    from pipeforge.tools.reference_check import sgd

    generated = load_module(job["module_path"])
    info = generated.SCHEDULE
    prank, replica = dist.get_rank(pipeline_group), rank // PIPELINE_RANKS
    stages = models.build_stages("mlp", info.stages, seed=1)
    reference = copy.deepcopy(stages)
    held = sorted({s for s, _ in info.held(prank)})
    mine = {s: copy.deepcopy(stages[s]) for s in held}
    mode = job["mode"]
    if mode == "fsdp-user":
        mine = {s: shard_by_hand(m, dp_group) for s, m in mine.items()}
    if mode == "replicate":
        mine = {s: replicate_by_hand(m, dp_group) for s, m in mine.items()}
    pipe = generated.make_pipeline(mine, loss_fn=models.loss_fn, group=pipeline_group, timeout=60,
                                   dp_group=dp_group, fsdp=mode == "fsdp")
    worst, compared = 0.0, 0

    def compare(got, want):
        nonlocal worst, compared
        compared += 1
        worst = max(worst, (full(got).detach() - want.detach()).abs().max().item())

    for step in range(job.get("steps", 2)):
        batches = [models.make_batch(info.stages, 2 * info.microbatches, seed=10 * step + r) for r in range(REPLICAS)]
        x, y = batches[replica]
        losses: list = []
        pipe.step(*((x,) if pipe.holds_first else ()), target=y if pipe.holds_last else None, losses=losses)
        want = reference_step(reference, batches, info.microbatches)
        if pipe.holds_last:
            for mb, loss in enumerate(losses):
                compare(loss, want[replica * info.microbatches + mb])
        for stage, module in mine.items():
            for got, expected in zip(module.parameters(), reference[stage].parameters()):
                compare(got.grad, expected.grad)
        sgd([p for m in mine.values() for p in m.parameters()], 0.1)
        sgd([p for s in reference for p in s.parameters()], 0.1)
    for stage, module in mine.items():
        for got, expected in zip(module.parameters(), reference[stage].parameters()):
            compare(got, expected)
    x, y = models.make_batch(info.stages, 2 * info.microbatches, seed=99 + replica)
    out = pipe.eval(*((x,) if pipe.holds_first else ()))
    if pipe.holds_last:
        with torch.no_grad():
            compare(out, models.run_stages(reference, x))
    return {"worst": worst, "compared": compared, "sharded": any(hasattr(p, "full_tensor")
                                                               for m in mine.values() for p in m.parameters())}


def replicated_jobs(rank: int, nproc: int, jobs: list[dict]) -> list[dict]:
    """Every job on one 4-process group (a worker for ``launch.spawn``)."""
    pipeline_group, dp_group = groups(rank)
    return [replicated_job(rank, job, pipeline_group, dp_group) for job in jobs]


# -- tied parameters and mixed precision ----------------------------------------------------------


def tied_job(rank: int, job: dict, pipeline_group, dp_group) -> dict:
    """The zoo's GPT with its LM head tied to the token embedding, every stage sharded (``fsdp=True``) or
    replicated (``dp``), against the unpipelined tied model in float64 (one parameter, both uses summed)."""
    from pipeforge.tools.generated import load_module
    from pipeforge.tools.reference_check import sgd
    from pipeforge.runtime.p2p import PipelineUsageError
    from tests.zoo import models as zoo

    generated = load_module(job["module_path"])
    info = generated.SCHEDULE
    prank, replica = rank % PIPELINE_RANKS, rank // PIPELINE_RANKS
    built = zoo.build("tied", info.stages, seed=0)
    reference = copy.deepcopy(built)
    held = sorted({s for s, _ in info.held(prank)})
    refusal = ""
    if {0, info.stages - 1} <= set(held):  # as built, one parameter in two stage modules of this rank
        shared = copy.deepcopy(built)
        try:
            generated.make_pipeline({s: shared[s] for s in held}, loss_fn=zoo.loss_fn,
                                    group=pipeline_group, dp_group=dp_group, fsdp=job["mode"] == "fsdp")
        except PipelineUsageError as error:
            refusal = str(error)
    mine = {s: copy.deepcopy(built[s]) for s in held}  # every stage its own copy, tied by tied_parameters
    pipe = generated.make_pipeline(mine, loss_fn=zoo.loss_fn, group=pipeline_group, timeout=60, dp_group=dp_group,
                                   fsdp=job["mode"] == "fsdp", tied_parameters=zoo.tied_parameters("tied", info.stages))
    worst, compared = 0.0, 0
    for step in range(2):
        batches = [zoo.batch("tied", 2 * info.microbatches, seed=10 * step + r) for r in range(REPLICAS)]
        tokens, targets, every_stage = batches[replica]
        pipe.step(*((tokens,) if pipe.holds_first else ()), target=targets if pipe.holds_last else None,
                  shared_kwargs=every_stage)
        tied_reference_step(reference, batches, info.microbatches)
        for stage, module in mine.items():
            for got, want in zip(module.parameters(), reference[stage].parameters()):
                worst, compared = max(worst, (full(got.grad) - want.grad).abs().max().item()), compared + 1
        sgd([p for m in mine.values() for p in m.parameters()], 0.1)
        sgd(list({id(p): p for s in reference for p in s.parameters()}.values()), 0.1)
    for stage, module in mine.items():
        for got, want in zip(module.parameters(), reference[stage].parameters()):
            worst, compared = max(worst, (full(got) - want).abs().max().item()), compared + 1
    return {"worst": worst, "compared": compared, "refusal": refusal}


def tied_reference_step(stages, batches, microbatches: int) -> None:
    from tests.zoo import models as zoo

    for tokens, targets, every_stage in batches:
        for m in range(microbatches):
            value = tokens.tensor_split(microbatches)[m]
            for stage in stages:
                value = stage(value, **{k: v.tensor_split(microbatches)[m] for k, v in every_stage.items()})
            zoo.loss_fn(value, targets.tensor_split(microbatches)[m]).backward()
    for param in {id(p): p for s in stages for p in s.parameters()}.values():
        param.grad.div_(microbatches * len(batches))


def mixed_precision_job(rank: int, job: dict, pipeline_group, dp_group) -> dict:
    """float32 stages sharded with ``MixedPrecisionPolicy(param_dtype, reduce_dtype)`` against the same
    stages unpipelined under FSDP with the same policy (microbatches accumulated without gradient sync,
    the last one reduces): the same casts and the same sums, so the gradient shards must be equal bit for bit."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    from pipeforge.tools import demo_models as models
    from pipeforge.tools.generated import load_module
    from pipeforge.runtime.microbatch import split_value

    generated = load_module(job["module_path"])
    info = generated.SCHEDULE
    microbatches = info.microbatches
    mesh = DeviceMesh.from_group(dp_group, device_type="cpu")
    policy = MixedPrecisionPolicy(param_dtype=getattr(torch, job["param_dtype"]),
                                  reduce_dtype=getattr(torch, job["reduce_dtype"]))

    def shard(module):
        return fully_shard(copy.deepcopy(module), mesh=mesh, mp_policy=policy, reshard_after_forward=False)

    stages = [stage.float() for stage in models.build_stages("mlp", info.stages, seed=1)]
    reference = [shard(stage) for stage in stages]
    held = sorted({s for s, _ in info.held(dist.get_rank(pipeline_group))})
    mine = {s: shard(stages[s]) for s in held}
    pipe = generated.make_pipeline(mine, loss_fn=models.loss_fn, group=pipeline_group, timeout=60, dp_group=dp_group)
    x, y = (t.float() for t in models.make_batch(info.stages, 2 * microbatches, seed=rank // PIPELINE_RANKS))
    pipe.step(*((x,) if pipe.holds_first else ()), target=y if pipe.holds_last else None)
    for m, (xm, ym) in enumerate(zip(split_value(x, microbatches), split_value(y, microbatches))):
        for module in reference:
            module.set_requires_gradient_sync(m == microbatches - 1)
            module.set_is_last_backward(m == microbatches - 1)
        models.loss_fn(models.run_stages(reference, xm), ym).backward()
    worst, compared, dtypes = 0.0, 0, set()
    for stage in held:
        for got, want in zip(mine[stage].parameters(), reference[stage].parameters()):
            expected = want.grad.to_local() / microbatches  # the pipeline divides by M after the reduction
            worst = max(worst, (got.grad.to_local() - expected).abs().max().item())
            compared += 1
            dtypes.add(str(got.grad.dtype))
    return {"worst": worst, "compared": compared, "dtypes": sorted(dtypes)}


def tied_and_mixed_jobs(rank: int, nproc: int, jobs: list[dict]) -> list[dict]:
    """Every job on one 4-process group (a worker for ``launch.spawn``)."""
    pipeline_group, dp_group = groups(rank)
    run = {"tied": tied_job, "mixed": mixed_precision_job}
    return [run[job["kind"]](rank, job, pipeline_group, dp_group) for job in jobs]
