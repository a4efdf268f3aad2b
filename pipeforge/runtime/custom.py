"""Custom functions per action kind, torch's ``register_custom_function`` for generated pipelines.

(The rank context runs them: ``RankContext.issue`` in ``pipeforge.runtime.context``.)

``make_pipeline(..., custom_functions={"OVERLAP_F_B": fn})`` (or
``pipeline.register_custom_function("OVERLAP_F_B", fn)``) makes ``fn(action,
ctx)`` run instead of the runtime's own implementation of every action of that
kind on this rank: ``F``, ``B``, ``I``, ``W``, ``OVERLAP_F_B`` (an overlap step
of the schedule, ``(0F7;7B3)``), ``UNSHARD``, ``RESHARD`` or ``REDUCE_GRAD``. As
in torch, ``action`` says what to do (``kind``, ``stage``, ``microbatch``, and
for ``OVERLAP_F_B`` its ``sub_actions``, both halves) and ``ctx`` gives what
torch's ``_PipelineContext`` gives (the microbatched inputs, targets and losses)
plus the stage (``ctx.module(stage)``, ``ctx.runner(stage)``) and the
runtime's own implementations: ``ctx.default(action)`` does what the pipeline
does without a custom function; ``ctx.run(action)`` does what the pipeline does
for ``action`` (its kind's custom function if one is registered, else the
default). A custom function usually wraps ``ctx.default`` (timing, streams,
an all-to-all of its own) or, for ``OVERLAP_F_B``, runs the two halves
together, for instance on two threads.

Without an ``OVERLAP_F_B`` function an overlap step runs its actions one after
the other, each through its own kind's function (torch's runtime calls its
built-in F/B for the halves instead). In ``eval()`` backward actions and
``REDUCE_GRAD`` do not run, so their functions are not called.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from pipeforge.runtime.p2p import PipelineError
<<<<<<< HEAD
from pipeforge.runtime.stage import StageRunner
from pipeforge.semantics import GRADIENT_KINDS, RUNTIME_METHODS, compute_kind_names, lane

COMPUTE_KINDS = compute_kind_names()  # semantics: F, B, I, W and any compute kind added there
KINDS = (*COMPUTE_KINDS, "OVERLAP_F_B", "UNSHARD", "RESHARD", "REDUCE_GRAD")
BACKWARD_KINDS = (*(kind for kind in COMPUTE_KINDS if kind != "F"), "REDUCE_GRAD")  # only while training
WEIGHT_GRADIENT_KINDS = tuple(sorted(kind.value for kind in GRADIENT_KINDS))
FORWARD_KINDS = ("F", "R")  # run the stage's forward (R again, under autograd)
=======
from pipeforge.semantics import compute_kind_names

if TYPE_CHECKING:
    from pipeforge.runtime.context import RankContext, ScheduleInfo
    from pipeforge.runtime.stage import StageRunner

COMPUTE_KINDS = compute_kind_names()  # semantics: F, B, I, W and any compute kind added there
KINDS = (*COMPUTE_KINDS, "OVERLAP_F_B", "UNSHARD", "RESHARD", "REDUCE_GRAD")
>>>>>>> main


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
        raise PipelineError(f"no custom function for action kind {kind!r}; the kinds are {', '.join(KINDS)}")
    return name


def custom_functions(functions: dict | None) -> dict[str, CustomFunction]:
    """``make_pipeline``'s ``custom_functions`` checked: kinds by name, callables as values."""
    checked: dict[str, CustomFunction] = {}
    for kind, function in (functions or {}).items():
        if not callable(function):
            raise PipelineError(f"custom function for {kind!r} is {type(function).__name__}, not callable")
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
        return {mb: loss for runner in self._ctx.runners.values() for mb, loss in runner.losses.items()}

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
<<<<<<< HEAD


class HookedRankContext(RankContext):
    """A ``RankContext`` whose compute actions go through custom functions and the stages' data parallelism."""

    def __init__(self, *args, functions: dict[str, CustomFunction], data_parallel: DataParallel, **kwargs):
        super().__init__(*args, **kwargs)
        self.functions = functions
        self.data_parallel = data_parallel
        self._collecting: list[StageAction] | None = None
        # the runtime's own compute of each kind (RankContext's, below the custom functions)
        own = super()
        self._computes: dict[str, Callable[[int, int, int], None]] = {
            kind: getattr(own, RUNTIME_METHODS[ActionKind(kind)]) for kind in COMPUTE_KINDS}

    # -- what generated rank functions call --------------------------------------

    def forward(self, stage: int, mb: int, chain: int = 0) -> None:
        self._issue_compute("F", stage, mb, chain)

    def backward(self, stage: int, mb: int, chain: int = 0) -> None:
        self._issue_compute("B", stage, mb, chain)

    def backward_input(self, stage: int, mb: int, chain: int = 0) -> None:
        self._issue_compute("I", stage, mb, chain)

    def backward_weight(self, stage: int, mb: int, chain: int = 0) -> None:
        self._issue_compute("W", stage, mb, chain)

    def recompute(self, stage: int, mb: int, chain: int = 0) -> None:
        self._issue_compute("R", stage, mb, chain)

    def offload(self, stage: int, mb: int, chain: int = 0) -> None:
        self._issue_compute("OFFLOAD", stage, mb, chain)

    def reload(self, stage: int, mb: int, chain: int = 0) -> None:
        self._issue_compute("RELOAD", stage, mb, chain)

    def reduce_grad(self, stage: int, chain: int = 0) -> None:
        self.issue(StageAction("REDUCE_GRAD", stage))

    def unshard(self, stage: int, chain: int = 0) -> None:
        self.issue(StageAction("UNSHARD", stage))

    def reshard(self, stage: int, chain: int = 0) -> None:
        self.issue(StageAction("RESHARD", stage))

    @contextmanager
    def overlap(self) -> Iterator[None]:
        """An overlap step: its actions are collected, then issued as one OVERLAP_F_B."""
        if self._collecting is not None:
            raise PipelineError(f"rank {self.rank}: an overlap step inside another")
        self._collecting = []
        try:
            yield
            halves = tuple(self._collecting)
        finally:
            self._collecting = None
        self.issue(StageAction("OVERLAP_F_B", None, sub_actions=halves))

    # -- dispatch --------------------------------------------------------------------

    def issue(self, action: StageAction) -> None:
        if self._collecting is not None:
            self._collecting.append(action)
            return
        if not self.training and action.kind in BACKWARD_KINDS:
            return
        function = self.functions.get(action.kind)
        if function is None:
            self.run_default(action)
        else:
            function(action, ActionContext(self, action))

    def _issue_compute(self, kind: str, stage: int, mb: int, chain: int) -> None:
        """``issue`` of a compute action; without a custom function for its kind (the common case) the
        default runs at once, without making the ``StageAction`` only a custom function would see."""
        if self._collecting is None and kind not in self.functions:
            self._compute(kind, stage, mb, chain)
        else:
            self.issue(StageAction(kind, stage, mb, chain))

    def _compute(self, kind: str, stage: int, mb: int, chain: int) -> None:
        """The default of a compute action: the stage's data parallelism around the runtime's own compute."""
        if not self.training and kind != "F":
            return
        if lane(ActionKind(kind)) == "copy":  # OFFLOAD, RELOAD: the stage's parameters play no part
            self._computes[kind](stage, mb, chain)
            return
        self.data_parallel.before_compute(stage, kind not in FORWARD_KINDS)
        self._computes[kind](stage, mb, chain)
        if kind in WEIGHT_GRADIENT_KINDS and stage in self.data_parallel.upcasting:
            self.data_parallel.after_weight_gradients(stage)

    def run_default(self, action: StageAction) -> None:
        kind = action.kind
        if kind in self._computes:
            self._compute(kind, action.stage, action.microbatch, action.chain)
        elif kind == "OVERLAP_F_B":
            with self.activations.overlap():  # one step for the activation count: additions, then releases
                for half in action.sub_actions:
                    self.issue(half)
        elif kind == "UNSHARD":
            self.data_parallel.unshard(action.stage)
        elif kind == "RESHARD":
            self.data_parallel.reshard(action.stage)
        elif kind == "REDUCE_GRAD":
            super().reduce_grad(action.stage)
            self.data_parallel.reduce(action.stage)
        else:
            raise PipelineError(f"rank {self.rank}: unknown action kind {kind!r}")
=======
>>>>>>> main
