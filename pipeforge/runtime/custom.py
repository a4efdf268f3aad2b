"""Custom functions per action kind, torch's ``register_custom_function`` for generated pipelines.

``custom_functions({kind: fn})`` checks and names the functions of ``make_pipeline(custom_functions=...)``
(kinds ``F``, ``B``, ``I``, ``W``, ``OVERLAP_F_B``, ``UNSHARD``, ``RESHARD``, ``REDUCE_GRAD``, or
torch's ``_ComputationType`` names); ``fn(action, ctx)`` then runs instead of the runtime's own
implementation of every action of that kind on the rank, with a ``StageAction`` (``kind``, ``stage``,
``microbatch``, ``sub_actions``) and an ``ActionContext`` (inputs, targets, losses, ``module(stage)``,
``default(action)``, ``run(action)``). The rank context runs them (``RankContext.issue``). The whole
contract: ``docs/runtime-fsdp.md`` (Custom functions).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from pipeforge.runtime.p2p import PipelineUsageError
from pipeforge.semantics import compute_kind_names

if TYPE_CHECKING:
    from pipeforge.runtime.context import RankContext, ScheduleInfo
    from pipeforge.runtime.stage import StageRunner

COMPUTE_KINDS = compute_kind_names()  # semantics: F, B, I, W and any compute kind added there
KINDS = (*COMPUTE_KINDS, "OVERLAP_F_B", "UNSHARD", "RESHARD", "REDUCE_GRAD")


@dataclass(frozen=True)
class StageAction:
    """One action a rank function issues: torch's ``_Action`` (``stage`` is None for OVERLAP_F_B)."""

    kind: str
    stage: int | None
    microbatch: int | None = None
    chain: int = 0
    sub_actions: tuple[StageAction, ...] = ()

    def __str__(self) -> str:
        if self.kind == "OVERLAP_F_B":
            return "(" + ";".join(map(str, self.sub_actions)) + ")OVERLAP_F_B"
        text = f"{self.stage}{self.kind}" + ("" if self.microbatch is None else str(self.microbatch))
        return text + (f"@{self.chain}" if self.chain else "")


CustomFunction = Callable[[StageAction, "ActionContext"], None]


def kind_name(kind: Any) -> str:
    """``"F"``, torch's ``_ComputationType.FORWARD`` or pipeforge's ``ActionKind.F`` -> ``"F"``."""
    name = getattr(kind, "value", kind)
    name = {"FORWARD": "F", "FULL_BACKWARD": "B", "BACKWARD_INPUT": "I", "BACKWARD_WEIGHT": "W"}.get(name, name)
    if name not in KINDS:
        raise PipelineUsageError(f"no custom function for action kind {kind!r}; the kinds are {', '.join(KINDS)}")
    return name


def custom_functions(functions: dict | None) -> dict[str, CustomFunction]:
    """``make_pipeline``'s ``custom_functions`` checked: kinds by name, callables as values."""
    if functions is not None and not isinstance(functions, Mapping):
        raise PipelineUsageError(f"custom_functions must be a dict from action kind to function (or None), got "
                                 f"{type(functions).__name__}")
    checked: dict[str, CustomFunction] = {}
    for kind, function in (functions or {}).items():
        if not callable(function):
            raise PipelineUsageError(f"custom function for {kind!r} is {type(function).__name__}, not callable")
        checked[kind_name(kind)] = function
    return checked


class ActionContext:
    """What a custom function gets besides its action (torch's ``_PipelineContext`` and the stage)."""

    def __init__(self, rank_context: RankContext, action: StageAction):
        self._ctx = rank_context
        self.action = action

    @property
    def rank(self) -> int:
        return self._ctx.rank

    @property
    def schedule(self) -> ScheduleInfo:
        """The schedule's ranks, stages, microbatches and placement (torch's ``schedule_ref``)."""
        return self._ctx.info

    @property
    def training(self) -> bool:
        return self._ctx.training

    @property
    def inputs(self) -> list[tuple]:
        """The microbatches of ``step()``'s positional inputs (torch's ``arg_mbs``; on the rank holding stage 0)."""
        return [args for args, _ in self._ctx.inputs]

    @property
    def kwargs(self) -> list[dict]:
        """The microbatches of ``step()``'s keyword inputs (torch's ``kwarg_mbs``; on the rank holding stage 0)."""
        return [kwargs for _, kwargs in self._ctx.inputs]

    @property
    def targets(self) -> list:
        """The microbatches of ``target`` (torch's ``target_mbs``; on the rank holding the last stage)."""
        return self._ctx.targets

    @property
    def losses(self) -> dict[int, torch.Tensor]:
        """The losses computed so far on this rank, by microbatch."""
        return {mb: loss for runner in self._ctx.runners.values() for mb, loss in runner.detached_losses().items()}

    def runner(self, stage: int, chain: int = 0) -> StageRunner:
        return self._ctx.runner(stage, chain)

    def module(self, stage: int, chain: int = 0) -> torch.nn.Module:
        return self.runner(stage, chain).module

    def default(self, action: StageAction | None = None) -> None:
        """The runtime's own implementation of ``action`` (this function's action when left out)."""
        self._ctx.run_default(action or self.action)

    def run(self, action: StageAction) -> None:
        """What the pipeline does for ``action``: its kind's custom function if registered, else the default."""
        self._ctx.issue(action)
