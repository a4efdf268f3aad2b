"""Custom functions per action kind (torch's register_custom_function) on generated pipelines.

One spawn of 2 gloo processes runs: DualPipeV with an OVERLAP_F_B function that
runs the two halves of every overlap step on two threads at once, and
schedules whose every action kind goes through a counting function that calls
the default; both match the unpipelined model exactly, and the counts equal
the schedule's actions of each kind on each rank. A custom function that raises
names its rank, action and function there, and the peer learns it at once.
"""

from __future__ import annotations

import threading
from collections import Counter

import pytest

import pipeforge
from pipeforge.generator import codegen
from pipeforge.passes import PassOptions, apply_passes, lower
from pipeforge.runtime.custom import KINDS, custom_functions
from pipeforge.tools.launch import spawn
from pipeforge.runtime.p2p import PipelineError


def overlap_on_two_threads(action, ctx) -> None:
    """Both halves of an overlap step at once, each on its own thread."""
    errors: list[BaseException] = []

    def run(half):
        try:
            ctx.run(half)
        except BaseException as error:  # noqa: BLE001 - handed to the caller below
            errors.append(error)

    threads = [threading.Thread(target=run, args=(half,)) for half in action.sub_actions]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    ctx.module(action.sub_actions[0].stage)  # the stage is reachable from the context
    OVERLAPPED.append(tuple(str(half) for half in action.sub_actions))


OVERLAPPED: list[tuple[str, ...]] = []


def custom_job(rank: int, job: dict) -> dict:
    from torch.distributed.pipelining import schedules as torch_schedules

    from pipeforge.tools import demo_models as models
    from pipeforge.tools.generated import load_module
    from pipeforge.tools.reference_check import Differences, Reference, sgd

    generated = load_module(job["module_path"])
    info = generated.SCHEDULE
    stages = models.build_stages("mlp", info.stages, seed=2)
    mine = {s: stages[s] for s in sorted({s for s, _ in info.held(rank)})}
    counts: Counter = Counter()
    functions = {"OVERLAP_F_B": overlap_on_two_threads} if job["overlap"] else {}
    pipe = generated.make_pipeline(mine, loss_fn=models.loss_fn, timeout=60, custom_functions=functions)
    if job["count"]:
        def counting(action, ctx):
            counts[action.kind] += 1
            assert ctx.action is action and ctx.rank == rank and ctx.schedule is info
            ctx.default()

        for kind in KINDS:  # torch's own names work too
            pipe.register_custom_function(torch_schedules.FORWARD if kind == "F" else kind, counting)
    reference = Reference(stages, info.microbatches, True)
    diffs = Differences()
    OVERLAPPED.clear()
    for step in range(2):
        x, y = models.make_batch(info.stages, 2 * info.microbatches, seed=step)
        losses: list = []
        pipe.step(*((x,) if pipe.holds_first else ()), target=y if pipe.holds_last else None, losses=losses)
        want_losses, _ = reference.step(x, y)
        for mb, loss in enumerate(losses):
            diffs.add(f"step {step} loss {mb}", loss, want_losses[mb])
        for stage, module in mine.items():
            for got, want in zip(module.parameters(), reference.stages[stage].parameters()):
                diffs.add(f"step {step} grad of stage {stage}", got.grad, want.grad)
        sgd([p for m in mine.values() for p in m.parameters()], 0.1)
        sgd(reference.parameters(), 0.1)
    return {"max_abs": diffs.max_abs, "compared": diffs.compared, "missing": diffs.missing,
            "counts": dict(counts), "overlapped": len(OVERLAPPED)}


def custom_jobs(rank: int, nproc: int, jobs: list[dict]) -> list[dict]:
    return [custom_job(rank, job) for job in jobs]


def expected_counts(schedule: pipeforge.Schedule, steps: int) -> list[dict]:
    """Per rank, how many actions of each kind ``steps`` steps issue (overlap halves counted by kind)."""
    per_rank = []
    for program in schedule.programs:
        counts: Counter = Counter()
        for step in program:
            if step.overlap:
                counts["OVERLAP_F_B"] += steps
            for action in step.actions:
                kind = action.kind.value
                if kind in KINDS:
                    counts[kind] += steps
        per_rank.append(dict(counts))
    return per_rank


def fsdp_order(name: str, microbatches: int) -> pipeforge.Schedule:
    """A library schedule with UNSHARD/RESHARD (max_active_stages 1) and REDUCE_GRAD, lowered."""
    schedule = pipeforge.load(name, defines={"P": 2, "M": microbatches})
    return apply_passes(schedule, PassOptions(unshard=1, reduce_grad=True), lower=True)


@pytest.mark.distributed
@pytest.mark.timeout(400)
def test_custom_functions_overlap_by_hand_and_count_calls(tmp_path):
    dualpipev = pipeforge.load("dualpipev", defines={"P": 2, "M": 4})
    schedules = {"dualpipev": lower(dualpipev), "zbv": fsdp_order("zbv", 4),
                 "1f1b": fsdp_order("1f1b", 4)}
    paths = {name: str(codegen(s, tmp_path / name)) for name, s in schedules.items()}
    jobs = [{"module_path": paths["dualpipev"], "overlap": True, "count": False}]
    jobs += [{"module_path": path, "overlap": False, "count": True} for path in paths.values()]
    outcomes = spawn(custom_jobs, 2, jobs, timeout=60, deadline=360)
    assert all(o.ok for o in outcomes), "\n".join(o.error for o in outcomes if not o.ok)
    overlap_steps = sum(step.overlap for program in schedules["dualpipev"].programs for step in program)
    assert overlap_steps > 0
    assert sum(o.value[0]["overlapped"] for o in outcomes) == 2 * overlap_steps
    for index, name in enumerate(["dualpipev-threads", *schedules]):
        for outcome in outcomes:
            result = outcome.value[index]
            assert result["max_abs"] == 0.0 and result["compared"] > 0 and not result["missing"], (name, result)
    for index, (name, schedule) in enumerate(schedules.items(), start=1):
        counted = [o.value[index]["counts"] for o in outcomes]
        assert counted == expected_counts(schedule, 2), name
    assert {"UNSHARD", "RESHARD", "REDUCE_GRAD", "I", "W"} <= set(outcomes[0].value[2]["counts"])
    assert "OVERLAP_F_B" in outcomes[0].value[1]["counts"]


def test_custom_functions_are_checked():
    assert custom_functions({"FORWARD": print, "OVERLAP_F_B": print}) == {"F": print, "OVERLAP_F_B": print}
    with pytest.raises(PipelineError, match="no custom function for action kind 'SEND_F'"):
        custom_functions({"SEND_F": print})
    with pytest.raises(PipelineError, match="not callable"):
        custom_functions({"F": 3})


def failing_job(rank: int, nproc: int, module_path: str) -> dict:
    """Stage 1's custom F raises at microbatch 2; then rank 0's custom REDUCE_GRAD raises (no microbatch)."""
    import time

    from pipeforge.runtime.stage import CustomFunctionError, PeerStageError
    from pipeforge.tools import demo_models as models
    from pipeforge.tools.generated import load_module

    generated = load_module(module_path)
    info = generated.SCHEDULE
    stages = models.build_stages("mlp", info.stages, seed=2)
    mine = {s: stages[s] for s in sorted({s for s, _ in info.held(rank)})}

    def broken_forward(action, ctx):
        if action.stage == 1 and action.microbatch == 2:
            raise ValueError("the custom forward broke")
        ctx.default()

    def broken_reduce(action, ctx):
        raise RuntimeError("the custom reduce broke")

    found = {}
    for name, functions in (("F", {"F": broken_forward}), ("REDUCE_GRAD", {"REDUCE_GRAD": broken_reduce})):
        pipe = generated.make_pipeline(mine, loss_fn=models.loss_fn, timeout=60, custom_functions=functions)
        x, y = models.make_batch(info.stages, 2 * info.microbatches, seed=0)
        started = time.monotonic()
        try:
            pipe.step(*((x,) if pipe.holds_first else ()), target=y if pipe.holds_last else None)
        except CustomFunctionError as error:
            found[name] = {"own": True, "message": str(error), "stage": error.stage, "microbatch": error.microbatch,
                           "original": type(error.original).__name__, "cause": error.__cause__ is error.original}
        except PeerStageError as error:
            found[name] = {"own": False, "message": str(error), "failed_rank": error.failed_rank,
                           "action": error.action}
        found[name]["seconds"] = time.monotonic() - started
    return found


@pytest.mark.distributed
@pytest.mark.timeout(200)
def test_a_custom_function_that_raises_names_its_rank_action_and_function(tmp_path):
    path = str(codegen(pipeforge.load("1f1b", defines={"P": 2, "M": 4}), tmp_path / "failing"))
    outcomes = spawn(failing_job, 2, path, timeout=60, deadline=180)
    assert all(o.ok for o in outcomes), "\n".join(o.error for o in outcomes if not o.ok)
    rank0, rank1 = (o.value for o in outcomes)
    assert rank1["F"] == {**rank1["F"], "own": True, "stage": 1, "microbatch": 2, "original": "ValueError",
                          "cause": True}
    assert rank1["F"]["message"] == ("rank 1: custom function 'failing_job.<locals>.broken_forward' for F of "
                                     "stage 1, microbatch 2, action 1F2: ValueError: the custom forward broke")
    assert rank0["F"]["own"] is False and rank0["F"]["failed_rank"] == 1 and rank0["F"]["action"] == "1F2"
    assert "custom function 'failing_job.<locals>.broken_forward' for F of stage 1" in rank0["F"]["message"]
    assert rank0["REDUCE_GRAD"]["own"] and rank0["REDUCE_GRAD"]["microbatch"] is None
    assert rank0["REDUCE_GRAD"]["message"].startswith(
        "rank 0: custom function 'failing_job.<locals>.broken_reduce' for REDUCE_GRAD of stage 0, action "
        "0REDUCE_GRAD: RuntimeError: the custom reduce broke")
    assert rank1["REDUCE_GRAD"]["own"]  # rank 1's own REDUCE_GRAD raised too (every rank registered it)
    assert all(r[name]["seconds"] < 30 for r in (rank0, rank1) for name in r), "a rank waited out a timeout"
