"""What torchtitan's launcher builds for a CSV schedule, and the settings that make it build a given one.

torchtitan 0.3.0 (``torchtitan/distributed/pipeline_parallel.py``) runs a
``pipeline_parallel_schedule_csv`` with ``_PipelineScheduleRuntime``, but builds each
rank's stages from ``pipeline_parallel_schedule``'s class: "v" placement (rank r holds
stages r and 2P-1-r, exactly two per rank) for ZBVZeroBubble and DualPipeV, "loop"
(rank r holds r, r+P, ...) otherwise; the number of stages is P per single-stage
class and 2P per multi-stage one, or ceil((layers + first_less + last_less) /
layers_per_stage) when ``pipeline_parallel_layers_per_stage`` is set, divided evenly
over the ranks. ``launcher_stages`` says what that gives (torchtitan's own function
where it is installed, the same rule here otherwise); ``placement_violations`` where a
schedule disagrees with it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from pipeforge.errors import Argument, ArgumentError, UsageError, words
from pipeforge.ir import Schedule
from pipeforge.verifier.report import Violation

V_CLASSES = ("zbvzerobubble", "dualpipev")
SINGLE_CLASSES = ("1f1b", "gpipe", "pipelinesinglestage", "pipelineschedulesingle")
KNOWN = ("1F1B", "Interleaved1F1B", "GPipe", "LoopedBFS", "InterleavedZeroBubble", "PipelineScheduleSingle",
         "PipelineScheduleMulti", "ZBVZeroBubble", "DualPipeV")  # torch's get_schedule_class names


@dataclass(frozen=True)
class Launcher:
    """The ``[parallelism]`` settings that decide the stages torchtitan builds (its defaults)."""

    pp_schedule: str = "1F1B"
    layers: int | None = None  # the model's layer count; needed with layers_per_stage
    layers_per_stage: int | None = None
    first_stage_less_layers: int = 1
    last_stage_less_layers: int = 1
    model_parts: int | None = None  # len(module_fqns_per_model_part), when it is set

    def style(self) -> str:
        return "v" if self.pp_schedule.lower() in V_CLASSES else "loop"

    def single_stage(self) -> bool:
        return self.pp_schedule.lower() in SINGLE_CLASSES


class LauncherRefusal(Exception):
    """torchtitan refuses these settings (its own message)."""


def check_name(name: str) -> str:
    known = {k.lower(): k for k in KNOWN}
    if name.lower() not in known:
        raise ArgumentError(Argument("pp_schedule", value=repr(name)), f"torch knows {', '.join(KNOWN)}")
    return known[name.lower()]


def stage_count(launcher: Launcher, ranks: int) -> int:
    """torchtitan's ``_get_pipeline_metadata``: the number of (virtual) stages it builds."""
    if launcher.model_parts is not None:
        return launcher.model_parts
    if launcher.layers_per_stage is None:
        return ranks * (1 if launcher.single_stage() else 2)
    if launcher.layers is None:
        raise UsageError(words(Argument("layers_per_stage"), " needs ", Argument("layers"),
                               " (the model's number of layers)"))
    stages = math.ceil((launcher.layers + launcher.first_stage_less_layers + launcher.last_stage_less_layers)
                       / launcher.layers_per_stage)
    if stages % ranks:
        raise LauncherRefusal(f"Number of virtual stages ({stages}) must be divisible by pipeline parallel size "
                              f"({ranks})")
    per_rank = stages // ranks
    if launcher.single_stage() and per_rank != 1:
        raise LauncherRefusal(f"Single stage schedule requires exactly 1 stage per rank, but got {per_rank} "
                              f"stages per rank")
    if not launcher.single_stage() and per_rank < 2:
        raise LauncherRefusal(f"Multi-stage schedule requires at least 2 stages per rank, but got {per_rank} "
                              f"stages per rank")
    return stages


def launcher_stages(launcher: Launcher, ranks: int, stages: int, *,
                    use_torchtitan: bool | None = None) -> dict[int, tuple[int, ...]]:
    """rank -> the stage indices torchtitan builds there (``_get_pp_rank_to_stage_indices_mapping``)."""
    if use_torchtitan is None:
        use_torchtitan = torchtitan_available()
    if use_torchtitan:
        from torchtitan.distributed.pipeline_parallel import (
            _get_pp_rank_to_stage_indices_mapping as mapping,
        )

        try:
            return {r: tuple(mapping(r, ranks, launcher.pp_schedule, stages)) for r in range(ranks)}
        except (AssertionError, ValueError) as refused:
            raise LauncherRefusal(str(refused)) from None
    if stages % ranks:
        raise LauncherRefusal(f"num_stages {stages} must be evenly divisible by pp_degree {ranks}")
    per_rank = stages // ranks
    if launcher.style() == "loop":
        return {r: tuple(r + s * ranks for s in range(per_rank)) for r in range(ranks)}
    if per_rank != 2:
        raise LauncherRefusal(f"v schedules assume 2 stages per rank, got {per_rank}")
    return {r: (r, stages - 1 - r) for r in range(ranks)}


def torchtitan_available() -> bool:
    try:
        import torchtitan.distributed.pipeline_parallel  # noqa: F401
    except ImportError:
        return False
    return True


def placement_violations(schedule: Schedule, launcher: Launcher) -> tuple[dict, list[Violation]]:
    """What torchtitan builds for ``schedule``'s ranks, and each disagreement with the schedule's placement."""
    found: dict = {"pp_schedule": launcher.pp_schedule, "style": launcher.style(), "stages": None, "ranks": {}}
    try:
        stages = stage_count(launcher, schedule.ranks)
        built = launcher_stages(launcher, schedule.ranks, stages)
    except LauncherRefusal as refused:
        found["refusal"] = str(refused)
        return found, [Violation("placement", f"torchtitan refuses pipeline_parallel_schedule = "
                                              f"{launcher.pp_schedule!r} on {schedule.ranks} ranks: {refused}")]
    found["stages"] = stages
    found["ranks"] = {str(r): list(s) for r, s in built.items()}
    violations = []
    if stages != schedule.stages:
        violations.append(Violation("placement", f"torchtitan builds {stages} stages for pipeline_parallel_schedule "
                                                 f"= {launcher.pp_schedule!r} on {schedule.ranks} ranks"
                                                 f"{how_many(launcher)}, but the schedule has {schedule.stages}"))
    for rank in range(schedule.ranks):
        runs = tuple(sorted(schedule.stages_on(rank)))
        if tuple(sorted(built.get(rank, ()))) != runs:
            violations.append(rank_violation(schedule, launcher, rank, tuple(built.get(rank, ())), runs))
    return found, violations


def how_many(launcher: Launcher) -> str:
    if launcher.layers_per_stage is None:
        return f" ({'one stage' if launcher.single_stage() else 'two stages'} per rank by default)"
    return (f" (ceil(({launcher.layers} layers + {launcher.first_stage_less_layers} + "
            f"{launcher.last_stage_less_layers}) / {launcher.layers_per_stage} layers per stage))")


def rank_violation(schedule: Schedule, launcher: Launcher, rank: int, built: tuple, runs: tuple) -> Violation:
    steps = [step for step in schedule.programs[rank] if not step.is_idle]  # verify counts steps so
    stray = next(((index, step) for index, step in enumerate(steps)
                  for action in step.actions if action.is_compute and action.stage not in built), None)
    message = (f"torchtitan's launcher builds stages {list(built)} on rank {rank} ({launcher.style()!r} placement "
               f"of pipeline_parallel_schedule = {launcher.pp_schedule!r}), but the schedule runs stages "
               f"{list(runs)} there")
    if stray is None:
        return Violation("placement", message, rank=rank)
    index, step = stray
    return Violation("placement", message, rank=rank, step=index, location=str(step.span) if step.span else None,
                     span=step.span)
