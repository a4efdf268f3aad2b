"""``pipeforge export torchtitan``: a schedule as torchtitan 0.3.0 runs it, or why it cannot.

``plan_export(schedule, layers=..., microbatch_size=...)`` chooses the
``pipeline_parallel_schedule`` whose stage map (``interop.torchtitan``) is the
schedule's placement (one stage per rank: ``1F1B``; several on a loop:
``Interleaved1F1B``, or ``InterleavedZeroBubble`` when B is split; two per rank in a
V: ``ZBVZeroBubble``, or ``DualPipeV`` with overlap steps), the stage count it builds
(``module_fqns_per_model_part`` from torchtitan's own rule for LLMs when ``layers`` is
given and the default count differs), the batch that makes its microbatch count the
schedule's, and checks the result with ``verify --as torchtitan``. It refuses, with the
reason, what torchtitan cannot run: two chains, a placement neither loop nor V, a V
without two stages a rank, a stage count its defaults do not give without ``layers``,
actions torch's runtime lacks, a program torch's runtime would not run.
``Export.write(OUTDIR)`` writes ``<name>.csv`` and ``<name>.toml`` (``[parallelism]``,
``[training]``), each atomically.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from pipeforge.errors import Argument, PipeforgeError, words
from pipeforge.interop.torchtitan import (
    Launcher,
    LauncherRefusal,
    launcher_stages,
    stage_count,
)
from pipeforge.ir import ActionKind, Placement, Schedule
from pipeforge.interop.torchtitan import torchtitan_available
from pipeforge.files import write_outputs
from pipeforge.interop.torch_csv import to_csv_text
from pipeforge.interop.torch_target import verify_as
from pipeforge.semantics import SPLIT

TORCH_COMPUTE = frozenset({ActionKind.F, ActionKind.B, ActionKind.I, ActionKind.W})


class ExportRefusal(PipeforgeError):
    """torchtitan cannot run this schedule; the message says why."""

    kind = "refused"


@dataclass(frozen=True)
class Export:
    name: str
    csv: str
    settings: dict  # section -> key -> value
    stages: dict[int, tuple[int, ...]]
    launcher: Launcher

    def toml(self, csv_path: str) -> str:
        lines = [f"# torchtitan settings for schedule {self.name!r} (pipeforge export torchtitan)",
                 f"# the launcher builds stages {format_stages(self.stages)} with these, as the CSV runs them"]
        for section, values in self.settings.items():
            lines += ["", f"[{section}]"]
            for key, value in values.items():
                value = csv_path if key == "pipeline_parallel_schedule_csv" else value
                lines.append(f"{key} = {json.dumps(value)}")
        return "\n".join(lines) + "\n"

    def paths(self, out_dir: str | Path) -> tuple[Path, Path]:
        """Where ``write`` puts the CSV and the settings."""
        folder = Path(out_dir)
        return folder / f"{self.name}.csv", folder / f"{self.name}.toml"

    def write(self, out_dir: str | Path, *, force: bool = True) -> tuple[Path, Path]:
        """``OUT_DIR/<name>.csv`` and ``.toml``, both or neither; without ``force``, files there are
        replaced only by the same bytes (``files.check_replaceable``)."""
        csv_path, toml_path = self.paths(out_dir)
        write_outputs([(csv_path, self.csv), (toml_path, self.toml(str(csv_path.resolve())))], force=force,
                      make_dirs=True)
        return csv_path, toml_path


def format_stages(stages: dict[int, tuple[int, ...]]) -> str:
    return ", ".join(f"rank {rank}: {list(found)}" for rank, found in sorted(stages.items()))


def plan_export(schedule: Schedule, *, layers: int | None = None, microbatch_size: int = 1) -> Export:
    """The CSV and settings that make torchtitan run ``schedule``; ``ExportRefusal`` saying why not."""
    if schedule.chains > 1:
        raise ExportRefusal(f"{schedule.name!r} runs {schedule.chains} chains (a bidirectional schedule); torch's "
                            f"runtime, and so torchtitan, runs one")
    compute = schedule.compute_only()
    check_kinds(compute)
    name = class_for(compute)
    parts = model_parts(compute, name, layers)
    launcher = Launcher(name, layers, model_parts=len(parts) if parts else None)
    try:
        stages = launcher_stages(launcher, compute.ranks, stage_count(launcher, compute.ranks))
    except LauncherRefusal as refused:
        raise ExportRefusal(f"torchtitan refuses pipeline_parallel_schedule = {name!r}: {refused}") from None
    verdict = verify_as(compute, "torchtitan", launcher=launcher)
    if not verdict.valid:
        first = verdict.report.violations[0]
        where = f"{first.location}: " if first.location else ""
        raise ExportRefusal(f"torch's runtime would not run it as torchtitan loads it: {where}{first.kind}: "
                            f"{first.message}")
    parallelism = {"pipeline_parallel_degree": compute.ranks, "pipeline_parallel_schedule": name,
                   "pipeline_parallel_schedule_csv": "", "pipeline_parallel_microbatch_size": microbatch_size}
    if parts:
        parallelism["module_fqns_per_model_part"] = parts
    settings = {"parallelism": parallelism, "training": {"local_batch_size": compute.microbatches * microbatch_size}}
    return Export(compute.name, to_csv_text(compute), settings, stages, launcher)


def check_kinds(schedule: Schedule) -> None:
    for rank, index, action in schedule.actions():
        if action.is_compute and action.kind not in TORCH_COMPUTE:
            raise ExportRefusal(f"rank {rank} step {index}: {str(action)!r}: torch's runtime has no action "
                                f"{action.kind.value} (it runs F, B, I, W and their overlaps)")


def class_for(schedule: Schedule) -> str:
    """The pipeline_parallel_schedule whose stage map is the schedule's placement."""
    ranks, stages = schedule.ranks, schedule.stages
    placement = schedule.placement
    per_rank, rest = divmod(stages, ranks)
    split = any(a.kind in SPLIT[ActionKind.B] for _, _, a in schedule.actions())
    overlap = any(step.overlap for _, _, step in schedule.steps())
    if not rest and placement == Placement.loop(stages, ranks):
        if per_rank == 1:
            return "1F1B"
        return "InterleavedZeroBubble" if split else "Interleaved1F1B"
    if not rest and per_rank == 2 and placement == Placement.v(stages, ranks):
        return "DualPipeV" if overlap else "ZBVZeroBubble"
    shown = ", ".join(f"stage {s} on rank {r}" for s, r in enumerate(placement.stage_to_rank))
    if not rest and placement == Placement.v(stages, ranks):
        raise ExportRefusal(f"torchtitan's V placement holds exactly two stages a rank; {schedule.name!r} puts "
                            f"{per_rank} in a V on each")
    raise ExportRefusal(f"torchtitan builds each rank's stages in a loop (rank r: r, r+P, ...) or, for ZBVZeroBubble "
                        f"and DualPipeV, a V of two; {schedule.name!r} places {shown}")


def model_parts(schedule: Schedule, name: str, layers: int | None) -> list[list[str]] | None:
    """``module_fqns_per_model_part`` where torchtitan's default stage count is not the schedule's."""
    default = stage_count(Launcher(name), schedule.ranks)
    if default == schedule.stages and layers is None:
        return None
    if layers is None:
        raise ExportRefusal(words(f"torchtitan builds {default} stages for {name!r} on {schedule.ranks} ranks by "
                                  f"default, {schedule.name!r} has {schedule.stages}: give ", Argument("layers"),
                                  " (the model's layer count) to write module_fqns_per_model_part"))
    try:
        return llm_parts(schedule.stages, layers)
    except ValueError as refused:
        raise ExportRefusal(f"torchtitan cannot split {layers} layers into {schedule.stages} stages: "
                            f"{refused}") from None


def llm_parts(stages: int, layers: int, input_weight: int = 1, output_weight: int = 1) -> list[list[str]]:
    """torchtitan's ``_generate_llm_fqn_per_model_part`` (its own where installed)."""
    if torchtitan_available():
        from torchtitan.distributed.pipeline_parallel import (
            _generate_llm_fqn_per_model_part as generate,
        )

        return generate(stages, layers, input_weight, output_weight)
    return generate_parts(stages, layers, input_weight, output_weight)


def generate_parts(stages: int, layers: int, input_weight: int = 1, output_weight: int = 1) -> list[list[str]]:
    """The reimplementation of torchtitan's rule (tests check it equals torchtitan's)."""
    if stages < 1:
        raise ValueError("Number of stages must be at least 1")
    if stages == 1:
        return [["tok_embeddings", *(f"layers.{i}" for i in range(layers)), "norm", "lm_head"]]
    effective = layers + input_weight + output_weight
    if stages > effective:
        raise ValueError(f"Number of stages ({stages}) cannot be greater than effective layers ({effective})")
    per_stage, extra = divmod(effective, stages)
    if input_weight > per_stage:
        raise ValueError(f"input_weight ({input_weight}) exceeds minimum layers per stage ({per_stage}).")
    if output_weight > per_stage:
        raise ValueError(f"output_weight ({output_weight}) exceeds minimum layers per stage ({per_stage}).")
    parts, current = [], 0
    for stage in range(stages):
        count = per_stage + (1 if stage < extra else 0)
        count -= input_weight if stage == 0 else output_weight if stage == stages - 1 else 0
        taken = [f"layers.{i}" for i in range(current, min(current + max(count, 0), layers))]
        current += len(taken)
        head = ["tok_embeddings"] if stage == 0 else []
        tail = ["norm", "lm_head"] if stage == stages - 1 else []
        parts.append(head + taken + tail)
    return parts
