"""Pipeline x FSDP and pipeline x data parallel on 4 gloo processes equal the unpipelined model (float64).

The schedules get UNSHARD/RESHARD/REDUCE_GRAD from pipeforge's passes
(``unshard`` with max_active_stages 1, ``reduce_grad``, ``lower``); one more is
lowered by torch's own passes (``_add_unshard_reshard``, ``_add_reduce_grad``,
``_add_send_recv``) and read back from torch CSV; one is pipeforge's plain
lowering (REDUCE_GRAD, no UNSHARD), one holds no REDUCE_GRAD at all (the
gradients are then reduced at the end of ``step()``), one goes through
merge_bw too. One spawn runs every job; losses, gradients after
each of two steps, the parameters after them and an eval match to 1e-12.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import pipeforge
from pipeforge.generator import codegen
from pipeforge.interop.torch_csv import read_csv_text, to_csv_text
from pipeforge.tools.launch import spawn

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(600)]

SCHEDULES = ("1f1b", "interleaved-1f1b", "zb-h1", "zbv")
MICROBATCHES = 4


def torch_lowered(name: str, max_active_stages: int | None, reduce_grad: bool = True) -> pipeforge.Schedule:
    """A library schedule's compute order lowered by torch's passes, through torch CSV."""
    from tests.torch_stages import csv_text, torch_lowered_cells

    schedule = pipeforge.load(name, defines={"P": 2, "M": MICROBATCHES})
    rows = {rank: row.split(",") for rank, row in enumerate(to_csv_text(schedule, "compute_only").splitlines())}
    stage_to_rank = dict(enumerate(schedule.placements[0].stage_to_rank))
    lowered = torch_lowered_cells(rows, stage_to_rank, MICROBATCHES, max_active_stages, reduce_grad)
    return read_csv_text(csv_text(lowered), f"{name}-torch.csv")


def with_passes(name: str, **options) -> pipeforge.Schedule:
    from pipeforge.passes import PassOptions, apply_passes

    schedule = pipeforge.load(name, defines={"P": 2, "M": MICROBATCHES})
    return apply_passes(schedule, PassOptions(**options), lower=True)


def fsdp_jobs(out: Path) -> tuple[list[dict], list[tuple[str, str]]]:
    jobs, labels = [], []

    def add(schedule: pipeforge.Schedule, folder: str, modes: tuple[str, ...], label: str) -> None:
        path = str(codegen(schedule, out / folder))
        for mode in modes:
            jobs.append({"module_path": path, "mode": mode})
            labels.append((f"{label} {mode}", mode))

    for name in SCHEDULES:
        add(with_passes(name, unshard=1, reduce_grad=True), name, ("fsdp", "dp"), f"{name} unshard=1")
    add(with_passes("zbv", unshard=2, reduce_grad=True), "zbv-2", ("fsdp-user", "replicate"), "zbv unshard=2")
    add(with_passes("zb-h1", unshard=1, reduce_grad=True, merge_bw=True), "merged", ("fsdp",),
        "zb-h1 merge-bw unshard=1")
    add(torch_lowered("interleaved-1f1b", max_active_stages=1), "torch", ("fsdp",),
        "interleaved-1f1b torch's compute_comms (max_active_stages=1)")
    add(pipeforge.load("interleaved-1f1b", defines={"P": 2, "M": MICROBATCHES}), "own", ("fsdp-user", "dp"),
        "interleaved-1f1b plain lowering")
    add(torch_lowered("zb-h1", max_active_stages=None, reduce_grad=False), "bare", ("fsdp", "dp"),
        "zb-h1 without UNSHARD/REDUCE_GRAD")
    return jobs, labels


def test_pipeline_with_fsdp_and_data_parallel_equals_the_unpipelined_model(tmp_path):
    from tests.runtime.fsdp_jobs import TOLERANCE, replicated_jobs

    jobs, labels = fsdp_jobs(tmp_path)
    outcomes = spawn(replicated_jobs, 4, jobs, timeout=60, deadline=540)
    assert all(o.ok for o in outcomes), "\n".join(o.error for o in outcomes if not o.ok)
    failures = []
    for index, (label, mode) in enumerate(labels):
        results = [o.value[index] for o in outcomes]
        worst = max(r["worst"] for r in results)
        sharded = all(r["sharded"] for r in results)
        if worst > TOLERANCE or min(r["compared"] for r in results) == 0 or sharded != (mode != "dp"):
            failures.append(f"{label}: {results}")
    assert not failures, "\n".join(failures)


def tied_and_mixed_jobs(out: Path) -> tuple[list[dict], list[str]]:
    jobs, labels = [], []
    for name in ("1f1b", "interleaved-1f1b", "zbv"):  # the tie across ranks (1f1b, interleaved), on rank 0 (zbv)
        path = str(codegen(with_passes(name, unshard=1, reduce_grad=True), out / f"tied-{name}"))
        for mode in ("fsdp", "dp"):
            jobs.append({"kind": "tied", "module_path": path, "mode": mode})
            labels.append(f"tied {name} {mode}")
    for name in ("1f1b", "zb-h1", "zbv"):
        path = str(codegen(with_passes(name, unshard=1, reduce_grad=True), out / f"mixed-{name}"))
        policies = [("bfloat16", "float32"), ("bfloat16", "bfloat16")]
        if name == "zbv":
            policies.append(("float16", "float32"))
        for param_dtype, reduce_dtype in policies:
            jobs.append({"kind": "mixed", "module_path": path, "param_dtype": param_dtype,
                         "reduce_dtype": reduce_dtype})
            labels.append(f"mixed precision {name} param {param_dtype} reduce {reduce_dtype}")
    return jobs, labels


def test_tied_parameters_and_mixed_precision_under_fsdp(tmp_path):
    """Tied embedding and LM head with FSDP (and with plain data parallelism) equal the unpipelined tied
    model in float64; FSDP2 mixed precision equals the same stages under FSDP unpipelined, bit for bit
    (on ZBV only because a W's weight gradients move into the reduce dtype at once, as FSDP's
    post-backward does); stages sharing one parameter on a rank are refused under fsdp=True."""
    from tests.runtime.fsdp_jobs import TOLERANCE, tied_and_mixed_jobs as worker

    jobs, labels = tied_and_mixed_jobs(tmp_path)
    outcomes = spawn(worker, 4, jobs, timeout=60, deadline=540)
    assert all(o.ok for o in outcomes), "\n".join(o.error for o in outcomes if not o.ok)
    failures = []
    for index, label in enumerate(labels):
        results = [o.value[index] for o in outcomes]
        bound = TOLERANCE if label.startswith("tied") else 0.0
        if max(r["worst"] for r in results) > bound or min(r["compared"] for r in results) == 0:
            failures.append(f"{label}: {results}")
        if label.startswith("mixed") and any(r["dtypes"] != ["torch.float32"] for r in results):
            failures.append(f"{label}: the sharded gradients are not float32: {results}")
    refusals = {(j["mode"], o.rank): r["refusal"] for o in outcomes for r, j in zip(o.value, jobs)
                if j["kind"] == "tied" and r["refusal"]}
    assert sorted(refusals) == [("dp", 0), ("dp", 2), ("fsdp", 0), ("fsdp", 2)], refusals  # zbv's rank 0 only
    for (mode, _), text in refusals.items():
        assert text.startswith("rank 0: stage 0 ('embed.tokens.weight') and stage 3 ('head.out.weight') share one "
                               "parameter") and ("fsdp=True" if mode == "fsdp" else "dp_group=") in text, text
    assert not failures, "\n".join(failures)


def test_data_parallel_refuses_what_it_cannot_run():
    import torch

    from pipeforge.runtime.fsdp import data_parallel
    from pipeforge.runtime.p2p import PipelineError

    with pytest.raises(PipelineError, match="rank 0: fsdp=True shards the stages over dp_group; pass dp_group="):
        data_parallel(0, {0: torch.nn.Linear(2, 2)}, fsdp=True)
    replicas = data_parallel(1, {3: torch.nn.Linear(2, 2)})
    replicas.begin(training=True)
    with pytest.raises(PipelineError, match=r"rank 1 holds no replica of stage 2 \(UNSHARD\)"):
        replicas.unshard(2)
    replicas.reduce(3)
    with pytest.raises(PipelineError, match="rank 1: REDUCE_GRAD of stage 3 twice in one step"):
        replicas.reduce(3)
    replicas.end()
    replicas.begin(training=True)
    replicas.reduce(3)  # a new step reduces again
