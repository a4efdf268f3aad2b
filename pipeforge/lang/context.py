"""The mutable state of one elaboration: declarations so far, rank programs, limits.

Compiled statements (``statements.py``) are closures ``(Elaboration, env) -> None``
that read and extend this state. It lives only while one schedule is being
elaborated; the result is the immutable ``Schedule`` that ``finish`` builds.
"""

from __future__ import annotations

from pipeforge.errors import SemanticError, Source, Span
from pipeforge.ir import Action, CostModel, MemorySpec, Placement, Schedule, Step
from pipeforge.lang.programs import RankBuilder

# Bounds that keep a mistyped number from exhausting memory or time.
MAX_COUNT = 1_000_000
LOOP_FUEL = 20_000_000
MAX_ACTIONS = 2_000_000


class Elaboration:
    """Everything a schedule's statements have declared and emitted so far."""

    def __init__(self, name: str, source: Source | None, params: tuple[tuple[str, int], ...]) -> None:
        self.name = name
        self.source = source
        self.params = params
        self.ranks: int | None = None
        self.stages: int | None = None
        self.microbatches: int | None = None
        self.placements: tuple[Placement, ...] | None = None
        self.costs: CostModel | None = None
        self.memory: MemorySpec | None = None
        self.declared: dict[str, Span] = {}
        self.rank_spans: dict[int, Span] = {}
        self.programs: dict[int, RankBuilder] = {}
        self.program: RankBuilder | None = None
        self.sink: list[Step] | None = None
        self.chain = 0
        self.fuel = LOOP_FUEL
        self.actions_left = MAX_ACTIONS

    # -- declarations -------------------------------------------------------

    def declare(self, what: str, span: Span) -> None:
        """Note that ``what`` is declared at ``span``; refuse a second declaration."""
        first = self.declared.get(what)
        if first is not None:
            raise SemanticError(f"{what!r} is declared twice", span, notes=(f"first declared at {first}",))
        if self.program is not None:
            raise SemanticError(f"{what!r} cannot be declared inside a rank block", span)
        self.declared[what] = span

    def require_declared(self, names: tuple[str, ...], span: Span, user: str) -> None:
        missing = [name for name in names if name not in self.declared]
        if missing:
            listed = " and ".join(repr(name) for name in missing)
            raise SemanticError(f"{user} needs {listed} declared before it", span)

    # The declared counts, read by statements that have required them (``require_declared``) or that
    # run only inside a rank block, which requires all three; placements come with 'stages'.

    @property
    def rank_count(self) -> int:
        assert self.ranks is not None, "'ranks' is read before a require_declared check"
        return self.ranks

    @property
    def stage_count(self) -> int:
        assert self.stages is not None, "'stages' is read before a require_declared check"
        return self.stages

    @property
    def microbatch_count(self) -> int:
        assert self.microbatches is not None, "'microbatches' is read before a require_declared check"
        return self.microbatches

    @property
    def chain_count(self) -> int:
        assert self.placements is not None, "the placements are read before a require_declared check of 'stages'"
        return len(self.placements)

    def parameter_text(self) -> str:
        return ", ".join(f"{name} = {value}" for name, value in self.params)

    # -- rank programs ------------------------------------------------------

    def open_rank(self, rank: int, span: Span) -> RankBuilder:
        if self.program is not None:
            raise SemanticError("rank blocks cannot nest: this one is inside the block of rank "
                                f"{self.program.rank}", span)
        ranks = self.rank_count
        if not 0 <= rank < ranks:
            raise SemanticError(f"rank {rank} is out of range: this schedule has ranks 0..{ranks - 1}", span)
        first = self.rank_spans.get(rank)
        if first is not None:
            raise SemanticError(f"rank {rank} is given twice: a rank's steps must come from one rank block",
                                span, notes=(f"its first block is at {first}",))
        self.rank_spans[rank] = span
        program = self.programs[rank] = RankBuilder(rank)
        self.program, self.sink = program, program.steps
        return program

    def close_rank(self) -> None:
        self.program, self.sink = None, None

    def outside_rank(self, what: str, span: Span) -> SemanticError:
        return SemanticError(f"{what} outside a rank block: actions belong inside 'rank r {{ ... }}'", span)

    def spend(self, iterations: int, span: Span) -> None:
        self.fuel -= iterations
        if self.fuel < 0:
            raise SemanticError(f"this schedule is too large to elaborate (more than {LOOP_FUEL} loop "
                                "iterations in all)", span)

    def too_many_actions(self, span: Span) -> SemanticError:
        return SemanticError(f"this schedule emits more than {MAX_ACTIONS} actions; lower its parameters "
                             f"({self.parameter_text() or 'none'})", span)

    # -- checking actions ---------------------------------------------------

    def check_stage(self, stage: int, span: Span) -> int:
        stages = self.stage_count
        if 0 <= stage < stages:
            return stage
        raise SemanticError(f"stage {stage} is out of range: this schedule has stages 0..{stages - 1}", span)

    def check_microbatch(self, microbatch: int, span: Span) -> int:
        microbatches = self.microbatch_count
        if 0 <= microbatch < microbatches:
            return microbatch
        raise SemanticError(f"microbatch {microbatch} is out of range: this schedule has microbatches "
                            f"0..{microbatches - 1}", span)

    def check_chain(self, chain: int, span: Span) -> int:
        chains = self.chain_count
        if 0 <= chain < chains:
            return chain
        have = "one chain (0)" if chains == 1 else f"chains 0..{chains - 1}"
        raise SemanticError(f"chain {chain} is out of range: this schedule has {have}; "
                            "give 'stages N placement A, B' for a second chain", span)

    def check_action(self, action: Action, span: Span) -> None:
        """Range checks for an action written as a torch token."""
        self.check_stage(action.stage, span)
        if action.microbatch is not None:
            self.check_microbatch(action.microbatch, span)
        self.check_chain(action.chain, span)

    # -- the result ---------------------------------------------------------

    def finish(self, span: Span) -> Schedule:
        for what in ("ranks", "stages", "microbatches"):
            if what not in self.declared:
                raise SemanticError(f"schedule {self.name!r} never declares {what!r}", span)
        programs = tuple(
            tuple(self.programs[rank].steps) if rank in self.programs else () for rank in range(self.rank_count)
        )
        assert self.placements is not None, "'stages' is declared, and its placements with it"
        return Schedule(
            name=self.name, ranks=self.rank_count, stages=self.stage_count, microbatches=self.microbatch_count,
            placements=self.placements, programs=programs, costs=self.costs, memory=self.memory,
            params=self.params, source=self.source.text if self.source else None,
        )
