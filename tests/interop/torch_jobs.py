"""Run torch CSVs under torch's own ``_PipelineScheduleRuntime`` on gloo and compare with one process.

Each job names a compute-only CSV, its stages, microbatches and placement. Every
rank builds real ``PipelineStage`` objects for the stages the CSV puts on it (a
``Linear`` + ``tanh`` per stage, float64, seeded by stage), loads the CSV with
``_load_csv`` (torch's lowering), runs two ``step`` calls (gradients cleared before each) and compares the last one's with
the unpipelined model run microbatch by microbatch (gradients divided by M, as
``scale_grads``). What a job returns: ``("ran", max relative difference)`` or
``("failed", message)``; a hang ends with gloo's timeout as a failure.
"""

from __future__ import annotations

import torch

WIDTH = 4
BATCH_PER_MICROBATCH = 2
STEPS = 2


def stage_module(stage: int) -> torch.nn.Module:
    torch.manual_seed(1000 + stage)
    return torch.nn.Sequential(torch.nn.Linear(WIDTH, WIDTH), torch.nn.Tanh()).double()


def batch(microbatches: int):
    torch.manual_seed(7)
    x = torch.randn(microbatches * BATCH_PER_MICROBATCH, WIDTH, dtype=torch.float64)
    y = torch.randn(microbatches * BATCH_PER_MICROBATCH, WIDTH, dtype=torch.float64)
    return x, y


def mse(output, target):
    return torch.nn.functional.mse_loss(output, target)


def reference_grads(stages: int, microbatches: int, mine: list[int]) -> dict[int, list[torch.Tensor]]:
    modules = [stage_module(s) for s in range(stages)]
    x, y = batch(microbatches)
    for xs, ys in zip(x.chunk(microbatches), y.chunk(microbatches)):
        out = xs
        for module in modules:
            out = module(out)
        mse(out, ys).backward()
    return {s: [p.grad / microbatches for p in modules[s].parameters()] for s in mine}


def run_job(rank: int, job: dict):
    """One CSV under torch's runtime on this rank: ("ran", difference) or ("failed", message)."""
    from torch.distributed.pipelining import PipelineStage
    from torch.distributed.pipelining.schedules import _PipelineScheduleRuntime

    stages, microbatches = job["stages"], job["microbatches"]
    mine = [s for s, r in enumerate(job["placement"]) if r == rank]
    modules = {s: stage_module(s) for s in mine}
    try:
        pipeline_stages = [PipelineStage(modules[s], s, stages, torch.device("cpu"), group=job.get("group"))
                           for s in mine]
        schedule = _PipelineScheduleRuntime(pipeline_stages, microbatches, loss_fn=mse,
                                            defer_pp_recv=job.get("defer", False))
        schedule._load_csv(job["csv"], format=job.get("format", "compute_only"))
        x, y = batch(microbatches)
        args = (x,) if 0 in mine else ()
        for _ in range(STEPS):  # a second step meets what the first left behind (a receive never waited)
            for module in modules.values():
                module.zero_grad(set_to_none=True)  # as a training loop does (torch scales what is there)
            schedule.step(*args, target=y if stages - 1 in mine else None)
    except Exception as error:  # noqa: BLE001 (the verdict is compared with what happened)
        return ("failed", f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}")
    expected = reference_grads(stages, microbatches, mine)
    worst = 0.0
    for s in mine:
        for param, want in zip(modules[s].parameters(), expected[s]):
            if param.grad is None:
                return ("failed", f"stage {s}: a parameter got no gradient")
            worst = max(worst, ((param.grad - want).abs().max() / want.abs().max().clamp_min(1e-12)).item())
    return ("ran", worst)


def run_jobs(rank: int, nproc: int, jobs: list[dict]) -> list:
    """Several jobs one after another on the same group (only jobs expected to run: a hang spoils the rest)."""
    return [run_job(rank, job) for job in jobs]


def torchtitan_job(rank: int, job: dict):
    """An export built by torchtitan's own code on this rank and run: ("ran", difference), ("failed", why).

    From the exported TOML: ``ParallelismConfig``, torchtitan's ``_get_pipeline_metadata`` (the stage
    count), ``_generate_llm_fqn_per_model_part`` unless the parts are given, the stage map of
    ``_get_pp_rank_to_stage_indices_mapping``, real ``PipelineStage`` objects of those stages, and
    ``_build_pipeline_schedule`` (which loads the CSV into ``_PipelineScheduleRuntime``); one step, with
    gradients compared to one process (torchtitan's ``scale_grads=False``: sums over microbatches).
    """
    from types import SimpleNamespace

    import tomllib
    from torch.distributed.pipelining import PipelineStage
    from torchtitan.config import ParallelismConfig
    from torchtitan.distributed import pipeline_parallel as titan

    with open(job["toml"], "rb") as file:
        settings = tomllib.load(file)
    try:
        parallelism = ParallelismConfig(**settings["parallelism"])
        ranks = parallelism.pipeline_parallel_degree
        model = SimpleNamespace(layers=[None] * job["layers"])
        count, layers, first, last = titan._get_pipeline_metadata(SimpleNamespace(pp=ranks), parallelism, model)
        names = parallelism.module_fqns_per_model_part or titan._generate_llm_fqn_per_model_part(count, layers,
                                                                                                 first, last)
        stages = len(names)
        mine = titan._get_pp_rank_to_stage_indices_mapping(rank, ranks, parallelism.pipeline_parallel_schedule,
                                                           stages)
        modules = {s: stage_module(s) for s in mine}
        built = [PipelineStage(modules[s], s, stages, torch.device("cpu")) for s in mine]
        schedule = titan._build_pipeline_schedule(parallelism=parallelism,
                                                  local_batch_size=settings["training"]["local_batch_size"],
                                                  stages=built, loss_fn=lambda out, target: (mse(out, target), None))
        microbatches = settings["training"]["local_batch_size"] // parallelism.pipeline_parallel_microbatch_size
        x, y = batch(microbatches)
        schedule.step(*((x,) if 0 in mine else ()), target=y if stages - 1 in mine else None)
    except Exception as error:  # noqa: BLE001 (the test compares with what pipeforge said)
        return ("failed", f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}")
    expected = reference_grads(stages, microbatches, list(mine))
    worst = 0.0
    for s in mine:
        for param, want in zip(modules[s].parameters(), expected[s]):
            if param.grad is None:
                return ("failed", f"stage {s}: a parameter got no gradient")
            want = want * microbatches  # torchtitan does not scale gradients
            worst = max(worst, ((param.grad - want).abs().max() / want.abs().max().clamp_min(1e-12)).item())
    return ("ran", worst)


def torchtitan_jobs(rank: int, nproc: int, jobs: list[dict]) -> list:
    return [torchtitan_job(rank, job) for job in jobs]
