"""``pipeforge export torchtitan`` against torchtitan 0.3.0's own schedule-building code.

Every export pipeforge makes is built by torchtitan's code (its stage count, its LLM
split, its stage map, real ``PipelineStage`` objects and ``_build_pipeline_schedule``
loading the CSV into torch's runtime) on gloo and runs one step with the gradients of
one process; every schedule pipeforge refuses is one torchtitan would not build as
the CSV needs (its stage map differs for every schedule class, or it refuses).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib

from pipeforge.interop.torch_csv import read_csv_text
from pipeforge.interop.torchtitan import (
    KNOWN,
    Launcher,
    LauncherRefusal,
    launcher_stages,
    stage_count,
)
from pipeforge.interop.torchtitan_export import (
    ExportRefusal,
    generate_parts,
    plan_export,
)
from pipeforge.ir import Placement
from pipeforge.library import load_library_schedule

ROOT = Path(__file__).resolve().parents[2]
NO_TORCHTITAN = "torchtitan 0.3.0 is not installed (scripts/setup.sh installs it with --no-deps: docs/torch.md)"


def torchtitan_or_skip():
    return pytest.importorskip("torchtitan.distributed.pipeline_parallel", reason=NO_TORCHTITAN)
GRADIENT_TOLERANCE = 1e-10

EXPORTED = [  # (library schedule, parameters, --layers)
    ("1f1b", {"P": 2, "M": 4}, None),
    ("gpipe", {"P": 2, "M": 3}, None),
    ("zb-h1", {"P": 2, "M": 4}, None),
    ("zb-h2", {"P": 2, "M": 4}, None),
    ("interleaved-1f1b", {"P": 2, "M": 4}, None),
    ("interleaved-zb", {"P": 2, "M": 4}, None),
    ("looped-bfs", {"P": 2, "M": 4}, None),
    ("zbv", {"P": 2, "M": 4}, None),
    ("dualpipev", {"P": 2, "M": 6}, None),
    ("v-min", {"P": 2, "M": 4}, None),
    ("v-half", {"P": 2, "M": 4}, None),
    ("interleaved-1f1b", {"P": 2, "M": 4, "V": 3}, 6),  # 6 stages: module_fqns_per_model_part
]


def non_loop_placement():
    """Contiguous blocks: stages 0, 1 on rank 0 and 2, 3 on rank 1 (valid, but neither loop nor V)."""
    rows = [["0F0", "1F0", "0F1", "1F1"], ["2F0", "3F0", "3B0", "2B0", "2F1", "3F1", "3B1", "2B1"]]
    rows[0] += ["1B0", "0B0", "1B1", "0B1"]
    return read_csv_text("".join(",".join(row) + "\n" for row in rows), "blocks.csv")


REFUSED = {  # name -> (schedule, --layers, words the reason holds)
    "bidirectional": (lambda: load_library_schedule("chimera", {"P": 2, "M": 4}), None, "chains"),
    "blocks": (non_loop_placement, None, "loop"),
    "v-of-three": (lambda: load_library_schedule("interleaved-1f1b", {"P": 2, "M": 4, "V": 3}).__class__(
        **{**vars_of(load_library_schedule("interleaved-1f1b", {"P": 2, "M": 4, "V": 3})),
           "placements": (Placement.v(6, 2),)}), None, "two stages"),
    "twelve-stages-without-layers": (lambda: load_library_schedule("interleaved-1f1b", {"P": 2, "M": 4, "V": 3}),
                                     None, "give layers "),
    "too-few-layers": (lambda: load_library_schedule("interleaved-1f1b", {"P": 2, "M": 4, "V": 3}), 2,
                       "cannot split"),
}


def vars_of(schedule):
    from dataclasses import fields

    return {f.name: getattr(schedule, f.name) for f in fields(schedule)}


@pytest.mark.parametrize("name, params, layers", EXPORTED)
def test_every_library_export_is_planned(name, params, layers):
    plan = plan_export(load_library_schedule(name, params), layers=layers)
    assert plan.settings["parallelism"]["pipeline_parallel_degree"] == params["P"]
    assert plan.settings["training"]["local_batch_size"] == params["M"]


@pytest.mark.parametrize("label", sorted(REFUSED))
def test_refusals_give_their_reason(label):
    build, layers, words = REFUSED[label]
    with pytest.raises(ExportRefusal, match=words):
        plan_export(build(), layers=layers)


@pytest.mark.parametrize("label", ["blocks", "v-of-three", "twelve-stages-without-layers"])
def test_torchtitan_would_not_build_what_pipeforge_refuses(label):
    """No schedule class makes torchtitan's launcher build the stages the refused CSV places."""
    from torchtitan.distributed.pipeline_parallel import (
        _get_pp_rank_to_stage_indices_mapping as mapping,
    )

    schedule = REFUSED[label][0]()
    wanted = {r: tuple(sorted(schedule.stages_on(r))) for r in range(schedule.ranks)}
    for name in KNOWN:
        count = stage_count(Launcher(name), schedule.ranks)  # torchtitan's default count for the class
        try:
            built = {r: tuple(sorted(mapping(r, schedule.ranks, name, count))) for r in range(schedule.ranks)}
        except AssertionError:
            continue  # torchtitan refuses outright
        assert built != wanted, name


@pytest.mark.parametrize("stages, layers", [(1, 4), (2, 2), (4, 6), (6, 6), (3, 7), (8, 6), (12, 10), (5, 1)])
def test_llm_split_equals_torchtitans(stages, layers):
    from torchtitan.distributed.pipeline_parallel import (
        _generate_llm_fqn_per_model_part as theirs,
    )

    try:
        expected = theirs(stages, layers, 1, 1)
    except ValueError as refused:
        with pytest.raises(ValueError, match=re.escape(str(refused))):
            generate_parts(stages, layers)
        return
    assert generate_parts(stages, layers) == expected


def test_launcher_reimplementation_equals_torchtitan_on_refusals():
    torchtitan_or_skip()
    with pytest.raises(LauncherRefusal):
        launcher_stages(Launcher("ZBVZeroBubble"), 2, 6, use_torchtitan=True)
    with pytest.raises(LauncherRefusal):
        launcher_stages(Launcher("ZBVZeroBubble"), 2, 6, use_torchtitan=False)


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pipeforge", *args], capture_output=True, text=True, cwd=ROOT,
                          timeout=120, check=False)


def test_cli_writes_csv_and_settings_or_refuses(tmp_path):
    done = cli("export", "torchtitan", "zbv", "-D", "P=2", "-D", "M=4", "-o", str(tmp_path / "out"), "--json")
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)
    csv_path, toml_path = map(Path, found["files"])
    settings = tomllib.loads(toml_path.read_text())
    assert settings["parallelism"]["pipeline_parallel_schedule"] == "ZBVZeroBubble"
    assert Path(settings["parallelism"]["pipeline_parallel_schedule_csv"]) == csv_path.resolve()
    assert read_csv_text(csv_path.read_text()).ranks == 2
    refused = cli("export", "torchtitan", "chimera", "-o", str(tmp_path / "none"))
    assert refused.returncode == 1 and "refused:" in refused.stderr and not (tmp_path / "none").exists()
    truncated = tmp_path / "cut.csv"
    truncated.write_text("0F0,0F1,0B0,0B1\n1F0,1B0,1F1,1B")
    bad = cli("export", "torchtitan", str(truncated), "-o", str(tmp_path / "bad"))
    assert bad.returncode == 2 and "Traceback" not in bad.stderr and "cut.csv:2" in bad.stderr


@pytest.mark.distributed
@pytest.mark.timeout(600)
def test_torchtitans_own_code_builds_and_runs_every_export(tmp_path):
    from pipeforge.tools.launch import spawn

    torchtitan_or_skip()
    jobs, labels = [], []
    for name, params, layers in EXPORTED:
        plan = plan_export(load_library_schedule(name, params), layers=layers)
        _, toml_path = plan.write(tmp_path / f"{name}-{len(labels)}")
        stages = load_library_schedule(name, params).stages
        jobs.append({"toml": str(toml_path), "layers": layers or 2 * stages})
        labels.append(f"{name} {params}")
    cycle = tmp_path / "cycle.csv"  # a compute order torch cannot lower: pipeforge refuses its export
    cycle.write_text("0F0,0B0,0F1,0B1\n1F0,1F1,1B0,1B1\n")
    with pytest.raises(ExportRefusal, match="would not run"):
        plan_export(read_csv_text(cycle.read_text(), str(cycle)))
    toml_path = tmp_path / "cycle.toml"
    toml_path.write_text(f'[parallelism]\npipeline_parallel_degree = 2\npipeline_parallel_schedule = "1F1B"\n'
                         f'pipeline_parallel_schedule_csv = "{cycle}"\n[training]\nlocal_batch_size = 2\n')
    jobs.append({"toml": str(toml_path), "layers": 4})
    outcomes = spawn("tests.interop.torch_jobs:torchtitan_jobs", 2, jobs, timeout=30, deadline=540)
    assert all(o.ok for o in outcomes), [o.error[-400:] for o in outcomes if not o.ok]
    assert [o.value[-1][0] for o in outcomes] == ["failed", "failed"]  # torchtitan's own build refuses it too
    jobs.pop()
    outcomes = [type(o)(o.rank, o.ok, o.value[:-1], o.error) for o in outcomes]
    assert all(o.ok for o in outcomes), [o.error[-400:] for o in outcomes if not o.ok]
    failures = [(labels[i], [o.value[i] for o in outcomes]) for i in range(len(jobs))
                if not all(kind == "ran" and diff <= GRADIENT_TOLERANCE for kind, diff in (o.value[i] for o in outcomes))]
    assert not failures


@pytest.mark.parametrize("name", ["1F1B", "GPipe", "Interleaved1F1B", "ZBVZeroBubble", "LoopedBFS"])
@pytest.mark.parametrize("ranks, layers, per_stage", [(2, 6, None), (2, 6, 2), (2, 6, 4), (2, 14, 4), (4, 30, 4),
                                                      (3, 7, 3), (2, 2, 1)])
def test_stage_count_equals_torchtitans_metadata(name, ranks, layers, per_stage):
    """``stage_count`` (what ``--as torchtitan --layers --layers-per-stage`` assumes) against torchtitan's
    own ``_get_pipeline_metadata``: the same count, or both refuse."""
    from types import SimpleNamespace

    titan = torchtitan_or_skip()
    from torchtitan.config import ParallelismConfig

    parallelism = ParallelismConfig(pipeline_parallel_schedule=name, pipeline_parallel_layers_per_stage=per_stage)
    launcher = Launcher(name, layers, per_stage)
    try:
        theirs = titan._get_pipeline_metadata(SimpleNamespace(pp=ranks), parallelism,
                                              SimpleNamespace(layers=[None] * layers))[0]
    except ValueError:
        with pytest.raises(LauncherRefusal):
            stage_count(launcher, ranks)
        return
    assert stage_count(launcher, ranks) == theirs
