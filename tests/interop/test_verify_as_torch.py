"""``verify --as torch|torchtitan`` against torch 2.13 and torchtitan 0.3.0 themselves.

- The reimplementation of torch's lowering gives torch's program, action for
  action (or torch's refusal, word for word), on every library schedule at several
  sizes, with and without ``defer_pp_recv``, and on hand-broken orders.
- Every verdict agrees with what torch's ``_PipelineScheduleRuntime`` does when the
  CSV runs on gloo: valid ones run with the gradients of one process, invalid ones
  fail (torch refuses, raises, or computes other gradients).
- The torchtitan placement check equals torchtitan's own stage map and catches
  every mismatch of a table of hand cases.
"""

from __future__ import annotations

import json
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest

from pipeforge.errors import PipeforgeError, SemanticError
from pipeforge.interop.torch_csv import read_csv_text, to_csv_text
from pipeforge.interop.torch_target import verify_as
from pipeforge.interop.torchtitan import (
    Launcher,
    LauncherRefusal,
    launcher_stages,
    stage_count,
)
from pipeforge.library import load_library_schedule
from pipeforge.passes.torch_lowering import torch_lowering

ROOT = Path(__file__).resolve().parents[2]
LIBRARY = ["1f1b", "gpipe", "interleaved-1f1b", "interleaved-zb", "looped-bfs", "zb-h1", "zb-h2", "zbv",
           "dualpipev", "v-min", "v-half"]
SIZES = [(2, 4), (4, 8), (3, 6)]
GRADIENT_TOLERANCE = 1e-10

# Hand-broken compute orders (2 ranks, 2 stages, 2 microbatches unless said): what each breaks.
BROKEN = {
    "missing-backward": "0F0,0F1,0B0\n1F0,1B0,1F1,1B1\n",
    "cross-rank-cycle": "0F0,0B0,0F1,0B1\n1F0,1F1,1B0,1B1\n",
    "w-before-i": "0F0,0F1,0I0,0W0,0W1,0I1\n1F0,1I0,1W0,1F1,1I1,1W1\n",
    "f-order-on-a-rank": "0F0,0F1,0B0,0B1\n1F0,2F1,1F1,2F0,2B0,1B0,2B1,1B1\n",
    "i-without-w": "0F0,0F1,0I0,0W0,0I1\n1F0,1B0,1F1,1B1\n",
    "b-and-i-w": "0F0,0F1,0B0,0I0,0W0,0B1\n1F0,1B0,1F1,1B1\n",
    "last-b-before-f": "0F0,0F1,0B0,0B1\n1B0,1F0,1F1,1B1\n",
    "w-before-its-i": "0F0,0F1,0I0,0W1,0I1,0W0\n1F0,1I0,1W0,1F1,1I1,1W1\n",
}
# Broken orders torch loads and fails on while running (each in a process group of its own: a failed
# step leaves communication behind). A duplicated forward runs once, then its second receive is never
# waited for, and the next step fails ("Recv twice").
FAILING_AT_RUN = {
    "duplicate-forward": "0F0,0F0,0F1,0B0,0B1\n1F0,1B0,1F1,1B1\n",
    "duplicate-last-backward": "0F0,0F1,0B0,0B1\n1F0,1B0,1B0,1F1,1B1\n",
}
BROKEN_STAGES = {"f-order-on-a-rank": 3}


def library_cases():
    for name in LIBRARY:
        for ranks, microbatches in SIZES:
            if takes(name, ranks, microbatches):
                yield name, ranks, microbatches


def takes(name: str, ranks: int, microbatches: int) -> bool:
    """False where the schedule's own ``require`` refuses the size."""
    try:
        load_library_schedule(name, {"P": ranks, "M": microbatches})
    except PipeforgeError:
        return False
    return True


@cache
def library(name: str, ranks: int, microbatches: int):
    return load_library_schedule(name, {"P": ranks, "M": microbatches})


def broken(name: str):
    text = BROKEN.get(name) or FAILING_AT_RUN[name]
    return read_csv_text(text, f"{name}.csv", stages=BROKEN_STAGES.get(name, 2))


@pytest.mark.parametrize("defer", [False, True])
@pytest.mark.parametrize("name, ranks, microbatches", list(library_cases()))
def test_reimplemented_lowering_equals_torchs(name, ranks, microbatches, defer):
    schedule = library(name, ranks, microbatches)
    theirs = torch_lowering(schedule, defer_pp_recv=defer, use_torch=True)
    ours = torch_lowering(schedule, defer_pp_recv=defer, use_torch=False)
    assert (theirs.by, ours.by) == ("torch", "pipeforge")
    assert ours.refusal == theirs.refusal
    assert ours.program == theirs.program


@pytest.mark.parametrize("defer", [False, True])
@pytest.mark.parametrize("name", sorted(BROKEN))
def test_reimplemented_lowering_refuses_as_torch_does(name, defer):
    schedule = broken(name)
    theirs = torch_lowering(schedule, defer_pp_recv=defer, use_torch=True)
    ours = torch_lowering(schedule, defer_pp_recv=defer, use_torch=False)
    assert theirs.refusal is not None
    assert ours.refusal == theirs.refusal
    assert not verify_as(schedule).valid


def test_defer_recv_reorder_is_reported_as_the_difference():
    """The case found last round: torch's defer_pp_recv pairs the wrong receives on ZB-V."""
    verdict = verify_as(library("zbv", 4, 8), defer_pp_recv=True)
    assert verdict.compute.valid and not verdict.valid
    assert verdict.report.kinds() == {"mismatch"}
    assert "defer_pp_recv" in verdict.difference
    assert verify_as(library("zbv", 4, 8)).valid


# --- against torch's runtime on gloo ----------------------------------------------------------


def job(schedule, tmp_path: Path, label: str, defer: bool = False, text: str | None = None) -> dict:
    path = tmp_path / f"{label}.csv"
    path.write_text(text if text is not None else to_csv_text(schedule))
    return {"label": label, "csv": str(path), "stages": schedule.stages, "microbatches": schedule.microbatches,
            "placement": list(schedule.placement.stage_to_rank), "defer": defer}


def optimized(name: str, ranks: int, microbatches: int):
    from pipeforge.optimizer import optimize

    return optimize(library(name, ranks, microbatches), time_limit=1.0).schedule


def torch_dumps(ranks: int, microbatches: int, tmp_path: Path) -> list[tuple[str, object, str]]:
    """CSVs written by torch's own ``_dump_csv`` of its schedule classes, read back by pipeforge."""
    from tests.torch_stages import dump_torch_csv

    found = []
    for cls, per_rank in (("ScheduleInterleaved1F1B", 2), ("ScheduleLoopedBFS", 2),
                          ("ScheduleInterleavedZeroBubble", 2), ("ScheduleZBVZeroBubble", 2),
                          ("ScheduleDualPipeV", 2), ("ScheduleGPipe", 1)):
        path = dump_torch_csv(cls, ranks, microbatches, per_rank, tmp_path / f"{cls}.csv")
        text = path.read_text()
        found.append((f"torch-{cls}", read_csv_text(text, str(path), microbatches=microbatches), text))
    return found


def comms_dumps(ranks: int, microbatches: int, tmp_path: Path) -> list[tuple[str, object, str]]:
    """torch's own lowered programs (``_dump_csv(format="compute_comms")``), and one with two receives
    of a rank swapped (which torch then pairs with the wrong sends)."""
    from tests.torch_stages import dump_torch_csv

    found = []
    for cls in ("ScheduleInterleaved1F1B", "ScheduleLoopedBFS", "ScheduleInterleavedZeroBubble",
                "ScheduleZBVZeroBubble", "ScheduleDualPipeV"):
        path = dump_torch_csv(cls, ranks, microbatches, 2, tmp_path / f"{cls}-comms.csv", format="compute_comms")
        text = path.read_text()
        found.append((f"torch-comms-{cls}", read_csv_text(text, str(path), microbatches=microbatches), text))
    rows = [row.split(",") for row in found[0][2].splitlines()]
    receives = [i for i, cell in enumerate(rows[1]) if "RECV_F" in cell][:2]
    rows[1][receives[0]], rows[1][receives[1]] = rows[1][receives[1]], rows[1][receives[0]]
    text = "".join(",".join(row) + "\n" for row in rows)
    found.append(("reordered-receive", read_csv_text(text, "reordered.csv", microbatches=microbatches), text))
    return found


def agreement_jobs(ranks: int, tmp_path: Path) -> list[tuple[dict, bool]]:
    """(job, expected to run) for the library at two sizes, optimized orders, torch's dumps, broken ones."""
    cases = []
    for name, p, m in library_cases():
        if p != ranks:
            continue
        schedule = library(name, p, m)
        for defer in (False, True):
            cases.append((job(schedule, tmp_path, f"{name}-{p}-{m}-{defer}", defer),
                          verify_as(schedule, defer_pp_recv=defer).valid))
    for name in LIBRARY if ranks == 2 else ("1f1b", "zb-h1"):
        if takes(name, ranks, 2 * ranks):
            schedule = optimized(name, ranks, 2 * ranks)
            cases.append((job(schedule, tmp_path, f"optimized-{name}"), verify_as(schedule).valid))
    for label, schedule, text in torch_dumps(ranks, 2 * ranks, tmp_path):
        cases.append((job(schedule, tmp_path, label, text=text), verify_as(schedule).valid))
    for label, schedule, text in comms_dumps(ranks, 2 * ranks, tmp_path):
        cases.append(({**job(schedule, tmp_path, label, text=text), "format": "compute_comms"},
                      verify_as(schedule).valid))
    if ranks == 2:
        for name, text in BROKEN.items():
            schedule = broken(name)
            cases.append((job(schedule, tmp_path, name, text=text), verify_as(schedule).valid))
    return cases


@pytest.mark.distributed
@pytest.mark.timeout(600)
@pytest.mark.parametrize("ranks", [2, 3, 4])
def test_every_verdict_agrees_with_torchs_runtime_on_gloo(ranks, tmp_path):
    from pipeforge.tools.launch import spawn

    cases = agreement_jobs(ranks, tmp_path)
    assert any(not expected for _, expected in cases) and any(expected for _, expected in cases)
    outcomes = spawn("tests.interop.torch_jobs:run_jobs", ranks, [j for j, _ in cases], timeout=30, deadline=540)
    assert all(o.ok for o in outcomes), [o.error[-400:] for o in outcomes if not o.ok]
    disagreements = []
    for index, (case, expected) in enumerate(cases):
        results = [o.value[index] for o in outcomes]
        ran = all(kind == "ran" and diff <= GRADIENT_TOLERANCE for kind, diff in results)
        if ran != expected:
            disagreements.append((case["label"], expected, results))
    assert not disagreements


# --- torchtitan's placement -------------------------------------------------------------------

PLACEMENT_CASES = [  # (csv placement stage -> rank, pp_schedule, launcher disagrees)
    ((0, 1), "1F1B", False),
    ((0, 1, 0, 1), "Interleaved1F1B", False),
    ((0, 1, 1, 0), "ZBVZeroBubble", False),
    ((0, 1, 1, 0), "DualPipeV", False),
    ((0, 1, 1, 0), "Interleaved1F1B", True),  # a V where torchtitan builds a loop
    ((0, 1, 0, 1), "ZBVZeroBubble", True),  # a loop where torchtitan builds a V
    ((0, 1, 0, 1), "1F1B", True),  # two stages per rank, but a single-stage class builds one
    ((0, 1), "Interleaved1F1B", True),  # one stage per rank, but a multi-stage class builds two
    ((0, 0, 1, 1), "Interleaved1F1B", True),  # contiguous blocks: neither loop nor v
    ((1, 0), "1F1B", True),  # reversed ranks
    ((0, 1, 2, 0, 1, 2), "LoopedBFS", False),
    ((0, 1, 2, 2, 1, 0), "DualPipeV", False),
    ((0, 1, 2, 2, 1, 0), "InterleavedZeroBubble", True),
]


def placement_schedule(placement: tuple[int, ...]):
    """A valid GPipe-like compute order over ``placement`` (F of every stage, then B in reverse)."""
    ranks = max(placement) + 1
    rows: list[list[str]] = [[] for _ in range(ranks)]
    for mb in range(2):
        for stage, rank in enumerate(placement):
            rows[rank].append(f"{stage}F{mb}")
    for mb in range(2):
        for stage in reversed(range(len(placement))):
            rows[placement[stage]].append(f"{stage}B{mb}")
    return read_csv_text("".join(",".join(row) + "\n" for row in rows), "placed.csv")


@pytest.mark.parametrize("placement, pp_schedule, disagrees", PLACEMENT_CASES)
def test_placement_check_catches_every_mismatch(placement, pp_schedule, disagrees):
    schedule = placement_schedule(placement)
    verdict = verify_as(schedule, "torchtitan", launcher=Launcher(pp_schedule))
    assert verify_as(schedule).valid
    assert verdict.valid is not disagrees
    if disagrees:
        assert verdict.report.kinds() == {"placement"}
        assert "torchtitan" in verdict.report.violations[0].message


@pytest.mark.parametrize("placement, pp_schedule, disagrees", PLACEMENT_CASES)
def test_launcher_stages_equal_torchtitans_own(placement, pp_schedule, disagrees):
    pytest.importorskip("torchtitan.distributed.pipeline_parallel", reason="torchtitan 0.3.0 is not installed")
    ranks = max(placement) + 1
    launcher = Launcher(pp_schedule)
    stages = stage_count(launcher, ranks)
    try:
        theirs = launcher_stages(launcher, ranks, stages, use_torchtitan=True)
    except LauncherRefusal as refused:
        with pytest.raises(LauncherRefusal):
            launcher_stages(launcher, ranks, stages, use_torchtitan=False)
        assert str(refused)
        return
    assert launcher_stages(launcher, ranks, stages, use_torchtitan=False) == theirs


def test_placement_violation_names_the_rank_and_the_cell():
    schedule = placement_schedule((0, 1, 1, 0))
    verdict = verify_as(schedule, "torchtitan", launcher=Launcher("Interleaved1F1B"))
    first = verdict.report.violations[0]
    assert first.rank == 0 and first.location == "placed.csv:1:5"
    assert "builds stages [0, 2] on rank 0" in first.message and "runs stages [0, 3]" in first.message


# --- the command line -------------------------------------------------------------------------


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pipeforge", *args], capture_output=True, text=True, cwd=ROOT,
                          timeout=120, check=False)


def test_cli_verify_as_torch_json_extends_verifys(tmp_path):
    path = tmp_path / "zbv.csv"
    path.write_text(to_csv_text(library("zbv", 2, 4)))
    plain = json.loads(cli("verify", str(path), "--json").stdout)
    done = cli("verify", str(path), "--as", "torch", "--defer-pp-recv", "--json")
    found = json.loads(done.stdout)
    assert set(plain) <= set(found) and {"valid", "violations", "stats"} <= set(found)
    assert found["as"] == "torch" and found["torch"]["lowering"] == "torch"
    assert done.returncode == (0 if found["valid"] else 1)
    titan = cli("verify", str(path), "--as", "torchtitan", "--pp-schedule", "Interleaved1F1B")
    assert titan.returncode == 1 and "torchtitan's launcher builds stages [0, 2] on rank 0" in titan.stdout
    assert cli("verify", str(path), "--as", "torchtitan", "--pp-schedule", "ZBVZeroBubble").returncode == 0
    bad = cli("verify", str(path), "--as", "torchtitan", "--pp-schedule", "NoSuch")
    assert bad.returncode == 2 and "Traceback" not in bad.stderr


def test_stage_on_two_ranks_is_refused_by_both():
    with pytest.raises(SemanticError):
        read_csv_text("0F0,0B0\n0F1,0B1\n", "two.csv")


@pytest.mark.distributed
@pytest.mark.timeout(300)
@pytest.mark.parametrize("name", sorted(FAILING_AT_RUN))
def test_orders_torch_fails_on_while_running_are_invalid(name, tmp_path):
    from pipeforge.tools.launch import spawn
    from tests.load import scaled

    schedule = broken(name)
    assert not verify_as(schedule).valid
    case = job(schedule, tmp_path, name, text=FAILING_AT_RUN[name])
    outcomes = spawn("tests.interop.torch_jobs:run_jobs", 2, [case], timeout=scaled(8), deadline=60)
    results = [o.value[0] if o.ok else ("failed", o.error) for o in outcomes]
    assert any(kind == "failed" for kind, _ in results), results


def test_actions_torch_lacks_are_refused():
    """pipeforge's recompute (R) has no torch action: torch's CSV reader refuses it."""
    from pipeforge.interop.torchtitan_export import ExportRefusal, plan_export

    schedule = read_csv_text("0F0,0F1,0R0,0B0,0B1\n1F0,1B0,1F1,1B1\n", "recompute.csv")
    verdict = verify_as(schedule)
    assert verdict.compute.valid and not verdict.valid and "no action R" in verdict.lowering.refusal
    with pytest.raises(ExportRefusal, match="no action R"):
        plan_export(schedule)
