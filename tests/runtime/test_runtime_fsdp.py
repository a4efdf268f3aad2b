"""Pipeline x FSDP and pipeline x data parallel on 4 gloo processes equal the unpipelined model (float64).

The schedules carry UNSHARD/RESHARD/REDUCE_GRAD as torch's own passes place
them (``_add_unshard_reshard``, ``_add_reduce_grad``, ``_add_send_recv``),
exported as torch CSV and read back with pipeforge's reader; one more is
pipeforge's own lowering (REDUCE_GRAD, no UNSHARD) and one holds no
REDUCE_GRAD at all (the gradients are then reduced at the end of ``step()``).
One spawn runs every job; losses, gradients after each of two steps and the
parameters after them match to 1e-12.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

import pipeforge
from pipeforge.codegen import codegen
from pipeforge.interop.torch_csv import read_csv_text, to_csv_text
from pipeforge.runtime.launch import spawn

sys.path.insert(0, str(Path(__file__).resolve().parent))

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(600)]

SCHEDULES = ("1f1b", "interleaved-1f1b", "zb-h1", "zbv")
MICROBATCHES = 4


def torch_lowered(name: str, max_active_stages: int | None, reduce_grad: bool = True) -> pipeforge.Schedule:
    """A library schedule's compute order lowered by torch's passes, through torch CSV."""
    from torch_stages import csv_text, torch_lowered_cells

    schedule = pipeforge.load(name, defines={"P": 2, "M": MICROBATCHES})
    rows = {rank: row.split(",") for rank, row in enumerate(to_csv_text(schedule, "compute_only").splitlines())}
    stage_to_rank = dict(enumerate(schedule.placements[0].stage_to_rank))
    lowered = torch_lowered_cells(rows, stage_to_rank, MICROBATCHES, max_active_stages, reduce_grad)
    return read_csv_text(csv_text(lowered), f"{name}-torch.csv")


def fsdp_jobs(out: Path) -> tuple[list[dict], list[str]]:
    jobs, labels = [], []
    for name in SCHEDULES:
        path = str(codegen(torch_lowered(name, max_active_stages=1), out / name))
        for mode in ("fsdp", "dp"):
            jobs.append({"module_path": path, "mode": mode})
            labels.append(f"{name} {mode} (torch's UNSHARD/RESHARD/REDUCE_GRAD)")
    path = str(codegen(torch_lowered("zbv", max_active_stages=2), out / "zbv-2"))
    jobs.append({"module_path": path, "mode": "fsdp-user"})
    labels.append("zbv fsdp-user max_active_stages=2")
    path = str(codegen(pipeforge.load("interleaved-1f1b", defines={"P": 2, "M": MICROBATCHES}), out / "own"))
    jobs += [{"module_path": path, "mode": "fsdp-user"}, {"module_path": path, "mode": "dp"}]
    labels += ["interleaved-1f1b fsdp-user (pipeforge's lowering)", "interleaved-1f1b dp (pipeforge's lowering)"]
    path = str(codegen(torch_lowered("zb-h1", max_active_stages=None, reduce_grad=False), out / "bare"))
    jobs += [{"module_path": path, "mode": "fsdp"}, {"module_path": path, "mode": "dp"}]
    labels += ["zb-h1 fsdp without UNSHARD/REDUCE_GRAD", "zb-h1 dp without REDUCE_GRAD"]
    return jobs, labels


def test_pipeline_with_fsdp_and_data_parallel_equals_the_unpipelined_model(tmp_path):
    from fsdp_jobs import TOLERANCE, replicated_jobs

    jobs, labels = fsdp_jobs(tmp_path)
    outcomes = spawn(replicated_jobs, 4, jobs, timeout=60, deadline=540)
    assert all(o.ok for o in outcomes), "\n".join(o.error for o in outcomes if not o.ok)
    failures = []
    for index, label in enumerate(labels):
        results = [o.value[index] for o in outcomes]
        worst = max(r["worst"] for r in results)
        sharded = all(r["sharded"] for r in results)
        if worst > TOLERANCE or min(r["compared"] for r in results) == 0 or sharded != ("fsdp" in label):
            failures.append(f"{label}: {results}")
    assert not failures, "\n".join(failures)
