"""Generated pipelines on real local gloo processes equal the unpipelined model.

One spawn per process count runs every library schedule with several
microbatch counts, both models (stages that change the width; tuple
activations), eval, and scale_grads=False. Exact equality (float64) where the
schedule accumulates microbatches in the reference's order, 1e-5 relative
otherwise (Chimera sums two replicas; looped BFS runs backwards in another
order).
"""

from __future__ import annotations

import pytest

import pipeforge
import pipeforge.tools.demo_models
from pipeforge.generator import codegen
from pipeforge.library import names
from pipeforge.tools.launch import spawn, summarize
from tests.demo_jobs import demo_pipeline

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(240)]

# schedules whose gradient accumulation runs microbatches in order 0..M-1 on every stage
EXACT = {"gpipe", "1f1b", "interleaved-1f1b", "interleaved-zb", "zb-h1", "zb-h2", "zbv", "dualpipev"}
MICROBATCHES = {2: (2, 4, 6), 4: (4, 8)}


def library_jobs(ranks: int, out_dir) -> tuple[list[dict], list[tuple]]:
    jobs, labels = [], []
    for name in names():
        for microbatches in MICROBATCHES[ranks]:
            try:
                schedule = pipeforge.load(name, defines={"P": ranks, "M": microbatches})
            except pipeforge.SemanticError:  # a require of the schedule (e.g. DualPipeV: M >= 2P)
                continue
            path = str(codegen(schedule, out_dir / f"{name}-{microbatches}"))
            for model in ("mlp", "tuple"):
                jobs.append({"module_path": path, "model": model, "timeout": 20.0})
                labels.append((name, microbatches, model, True))
            if microbatches == MICROBATCHES[ranks][0]:
                jobs.append({"module_path": path, "model": "mlp", "timeout": 20.0, "scale_grads": False})
                labels.append((name, microbatches, "mlp", False))
    return jobs, labels


def run_jobs(rank: int, nproc: int, jobs: list[dict]) -> list[dict]:
    from pipeforge.tools.reference_check import CheckJob, check_rank

    return [check_rank(rank, nproc, CheckJob(**job)) for job in jobs]


@pytest.mark.parametrize("ranks", [2, 4])
def test_every_library_schedule_matches_the_unpipelined_model(ranks, tmp_path):
    jobs, labels = library_jobs(ranks, tmp_path)
    covered = {label[0] for label in labels}
    assert covered == set(names()), f"schedules not exercised on {ranks} ranks: {set(names()) - covered}"
    outcomes = spawn(run_jobs, ranks, jobs, timeout=20, deadline=200)
    assert all(o.ok for o in outcomes), "\n".join(o.error for o in outcomes if not o.ok)
    failures = []
    for index, (name, microbatches, model, scaled) in enumerate(labels):
        verdict = summarize([o.value[index] for o in outcomes])
        exact = name in EXACT
        ok = verdict["match"] and (verdict["max_abs_diff"] == 0.0 or not exact)
        if not ok:
            failures.append(f"{name} M={microbatches} {model} scale_grads={scaled}: {verdict}")
    assert not failures, "\n".join(failures)


def chimera_replica_grads(rank: int, nproc: int, path: str) -> dict:
    """Train one step of Chimera; return each stage replica's flattened gradient on this rank."""
    import torch

    from pipeforge.tools import demo_models as models
    from pipeforge.tools.generated import load_module

    generated = load_module(path)
    info = generated.SCHEDULE
    full = models.build_stages("mlp", info.stages, seed=3)
    held = sorted({stage for stage, _ in info.held(rank)})
    pipe = generated.make_pipeline({s: full[s] for s in held}, loss_fn=models.loss_fn, timeout=20)
    x, y = models.make_batch(info.stages, 2 * info.microbatches, seed=4)
    pipe.step(*((x,) if pipe.holds_first else ()), target=y if pipe.holds_last else None)
    return {
        (stage, chain): torch.cat([p.grad.flatten() for p in runner.module.parameters()]).tolist()
        for (stage, chain), runner in pipe.runners.items()
    }


@pytest.mark.parametrize("ranks", [2, 4])
def test_chimera_replicas_end_with_identical_gradients(ranks, tmp_path):
    path = str(codegen(pipeforge.load("chimera", defines={"P": ranks, "M": ranks}), tmp_path))
    outcomes = spawn(chimera_replica_grads, ranks, path, timeout=20, deadline=120)
    assert all(o.ok for o in outcomes), "\n".join(o.error for o in outcomes if not o.ok)
    by_stage: dict[int, list] = {}
    for outcome in outcomes:
        for (stage, _chain), grads in outcome.value.items():
            by_stage.setdefault(stage, []).append(grads)
    assert sorted(by_stage) == list(range(ranks))
    for stage, replicas in by_stage.items():
        assert len(replicas) == 2 and replicas[0] == replicas[1], f"stage {stage} replicas differ"


def pipelines_in_subgroups(rank: int, nproc: int, path: str) -> dict:
    """Data parallel over two pipeline groups: ranks {0, 1} and {2, 3} each run the schedule."""
    import torch.distributed as dist

    from pipeforge.tools.reference_check import CheckJob, check_rank

    groups = [dist.new_group([0, 1]), dist.new_group([2, 3])]
    mine = groups[rank // 2]
    report = check_rank(rank, nproc, CheckJob(path, steps=2, timeout=20.0), group=mine)
    return report


def test_a_pipeline_in_a_sub_group_composes_with_data_parallel(tmp_path):
    path = str(codegen(pipeforge.load("1f1b", defines={"P": 2, "M": 4}), tmp_path))
    outcomes = spawn(pipelines_in_subgroups, 4, path, timeout=20, deadline=120)
    assert all(o.ok for o in outcomes), "\n".join(o.error for o in outcomes if not o.ok)
    verdict = summarize([o.value for o in outcomes])
    assert verdict["match"] and verdict["max_abs_diff"] == 0.0, verdict
    assert [o.value["rank"] for o in outcomes] == [0, 1, 0, 1]


def step_and_eval_results(rank: int, nproc: int, path: str) -> dict:
    """What step() and eval() return on each rank, with and without outputs and losses."""
    from pipeforge.tools import demo_models as models

    pipe = demo_pipeline({"path": path, "wait": 20}, rank)
    x, y = models.make_batch(pipe.info.stages, 9, seed=0)  # 9 rows in 4 microbatches: sizes 3, 2, 2, 2
    args, target = ((x,) if pipe.holds_first else ()), (y if pipe.holds_last else None)
    losses: list = []
    quiet = pipe.step(*args, target=target, losses=losses, return_outputs=False)
    outputs = pipe.step(*args, target=target)
    evaluated = pipe.eval(*args)
    eval_losses: list = []
    pipe.eval(*args, target=target, losses=eval_losses)
    shape = None if outputs is None else tuple(outputs.shape)
    return {"quiet": quiet, "losses": len(losses), "shape": shape,
            "eval_shape": None if evaluated is None else tuple(evaluated.shape), "eval_losses": len(eval_losses)}


def test_step_and_eval_return_what_torch_returns(tmp_path):
    path = str(codegen(pipeforge.load("1f1b", defines={"P": 2, "M": 4}), tmp_path))
    outcomes = spawn(step_and_eval_results, 2, path, timeout=20, deadline=60)
    assert all(o.ok for o in outcomes), "\n".join(o.error for o in outcomes if not o.ok)
    first, last = outcomes[0].value, outcomes[1].value
    assert first == {"quiet": None, "losses": 0, "shape": None, "eval_shape": None, "eval_losses": 0}
    width = pipeforge.tools.demo_models.widths(2)[-1]
    assert last == {"quiet": None, "losses": 4, "shape": (9, width), "eval_shape": (9, width), "eval_losses": 4}


def shared_parameter_grads(rank: int, nproc: int, path: str) -> dict:
    """zbv on 2 ranks: stage 0 and stage 3 (both on rank 0) use one weight; compare with the unpipelined model."""
    import copy

    import torch

    from pipeforge.tools import demo_models as models
    from pipeforge.tools.generated import load_module

    generated = load_module(path)
    info = generated.SCHEDULE
    torch.manual_seed(0)
    full = [models.MlpStage(4, 4, s == info.stages - 1).double() for s in range(info.stages)]
    full[-1].linear.weight = full[0].linear.weight
    reference = copy.deepcopy(full)
    x, y = models.make_batch(1, 2 * info.microbatches, seed=1)
    x, y = x[:, :4], y[:, :4]
    for xm, ym in zip(x.tensor_split(info.microbatches), y.tensor_split(info.microbatches)):
        models.loss_fn(models.run_stages(reference, xm), ym).backward()
    held = sorted({s for s, _ in info.held(rank)})
    pipe = generated.make_pipeline({s: full[s] for s in held}, loss_fn=models.loss_fn, timeout=20)
    pipe.step(*((x,) if pipe.holds_first else ()), target=y if pipe.holds_last else None)
    return {s: [(p.grad - q.grad / info.microbatches).abs().max().item()
                for p, q in zip(full[s].parameters(), reference[s].parameters())] for s in held}


def test_a_parameter_shared_by_two_stages_on_one_rank_is_scaled_once(tmp_path):
    path = str(codegen(pipeforge.load("zbv", defines={"P": 2, "M": 4}), tmp_path))
    outcomes = spawn(shared_parameter_grads, 2, path, timeout=20, deadline=120)
    assert all(o.ok for o in outcomes), "\n".join(o.error for o in outcomes if not o.ok)
    diffs = {stage: d for o in outcomes for stage, d in o.value.items()}
    assert sorted(diffs) == [0, 1, 2, 3]
    assert max(max(d) for d in diffs.values()) < 1e-12, diffs
