"""torch.distributed.pipelining's schedule CSV, read into the IR and written back.

``read_csv(path, stages=None, microbatches=None, placement=None)`` / ``read_csv_text(...)`` -> ``Schedule``:
one row per rank, one torch action string per cell (``compute_only`` or ``compute_comms``), read
strictly (a malformed cell is a ``PipeSyntaxError`` at ``file:line:col``, line = rank + 1), the shape
inferred from the cells unless stated and checked against them when stated. ``write_csv`` /
``to_csv_text(schedule, format)``: the schedule as torch writes it (a group as consecutive cells; a
bidirectional schedule is refused: torch has no chains). The format: ``docs/cli.md`` (convert).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import NamedTuple

from pipeforge.errors import (Argument, ArgumentError, PipeforgeError, PipeSyntaxError, SemanticError, Source, Span,
                              UsageError, words)
from pipeforge.files import read_bounded, without_bom, write_atomically
from pipeforge.ir import (COMM_KINDS, COMPUTE_KINDS, IDLE, KIND_OF_TEXT, Action, Placement, Schedule, Step, make_action,
                          parse_action)
from pipeforge.passes.lower import lower

OVERLAP_SUFFIX = "OVERLAP_F_B"
FORMATS = ("compute_only", "compute_comms")
MAX_COUNT = 1_000_000  # as the language's bound: a mistyped index must not exhaust memory or time


class Cell(NamedTuple):
    """One CSV cell: its text and where it sits (1-based line and column)."""

    text: str
    line: int
    col: int

    def span(self, file: Source, offset: int = 0, width: int | None = None) -> Span:
        width = len(self.text) - offset if width is None else width
        col = self.col + offset
        return file.span(self.line, col, self.line, col + max(width, 1))


# ---------------------------------------------------------------- reading


def read_csv(
    path: str | os.PathLike,
    *,
    stages: int | None = None,
    microbatches: int | None = None,
    placement: str | None = None,
) -> Schedule:
    """Read a torch schedule CSV file into a Schedule (see ``read_csv_text``)."""
    file = str(path)
    try:
        text = without_bom(read_bounded(file, "schedule file")).decode("utf-8")
    except UnicodeDecodeError:
        raise PipeSyntaxError(f"{file!r} is not UTF-8 text; expected a torch schedule CSV") from None
    return read_csv_text(text, filename=file, stages=stages, microbatches=microbatches, placement=placement)


def read_csv_text(
    text: str,
    filename: str = "<csv>",
    *,
    stages: int | None = None,
    microbatches: int | None = None,
    placement: str | None = None,
) -> Schedule:
    """Parse torch CSV text: one row per rank; infer or check stages, microbatches, placement."""
    programs = parse_rows(Source(filename, text))
    if not programs:
        raise SemanticError(f"{filename}: the CSV holds no rows; expected one row of actions per rank")
    extent = Extent.of(programs)
    n_stages = infer_count("stages", stages, extent.last_stage, lambda a: a.stage, filename)
    n_microbatches = infer_count("microbatches", microbatches, extent.last_microbatch, lambda a: a.microbatch,
                                 filename)
    stage_placement = resolve_placement(placement, extent.owners, n_stages, len(programs), filename)
    return Schedule(
        name=schedule_name(filename),
        ranks=len(programs),
        stages=n_stages,
        microbatches=n_microbatches,
        placements=(stage_placement,),
        programs=programs,
        source=text,
    )


def parse_rows(file: Source) -> tuple[tuple[Step, ...], ...]:
    """One program per line (torch's cells hold no commas or quotes, so a split is a CSV parse)."""
    lines = file.text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return tuple(parse_row(line.removesuffix("\r"), number, file) for number, line in enumerate(lines, start=1))


def parse_row(line: str, number: int, file: Source) -> tuple[Step, ...]:
    if not line:
        return ()
    steps, col, name = [], 1, file.name
    plain = PLAIN_ACTION.fullmatch
    for text in line.split(","):
        match = plain(text)
        if match is not None:  # the common case, read in place: nothing parse_action checks can fail
            stage, kind, microbatch = match.groups()
            action = make_action((int(stage), KIND_OF_TEXT[kind], int(microbatch), 0))
            steps.append(Step((action,), False, Span(name, number, col, number, col + len(text), file)))
        elif text and text[0] not in PADDING_OR_OPEN and text[-1] not in PADDING_OR_OPEN:
            span = Span(name, number, col, number, col + len(text), file)  # another bare token
            steps.append(Step((parse_token(text, span),), False, span))
        else:
            steps.append(parse_cell(Cell(text, number, col), file))
        col += len(text) + 1
    return tuple(steps)


PADDING_OR_OPEN = frozenset(" \t(")
# A bare compute or communication action with its microbatch and no chain (``2F0``, ``0SEND_F1``): the
# cells of a torch CSV but for idle, overlap and stage-only ones (those take ``parse_cell``/``parse_token``).
PLAIN_ACTION = re.compile(r"([0-9]+)({})([0-9]+)".format("|".join(
    sorted((kind.value for kind in COMPUTE_KINDS | COMM_KINDS), key=len, reverse=True))))


def parse_cell(cell: Cell, file: Source) -> Step:
    """One cell as a step: '' -> idle, '(..;..)OVERLAP_F_B' -> overlap, else one action."""
    stripped = cell.text.strip()
    if not stripped:
        return IDLE
    lead = len(cell.text) - len(cell.text.lstrip())
    if stripped[0] == "(":
        return parse_overlap(cell, stripped, lead, file)
    span = cell.span(file, lead, len(stripped))
    return Step((parse_token(stripped, span),), span=span)


def parse_overlap(cell: Cell, text: str, lead: int, file: Source) -> Step:
    whole = cell.span(file, lead, len(text))
    close = text.find(")")
    if close < 0:
        raise PipeSyntaxError(f"{text!r}: an overlap cell needs ')' then {OVERLAP_SUFFIX}, like "
                              "'(0F7;7B3)OVERLAP_F_B'", whole)
    suffix = text[close + 1:]
    if suffix != OVERLAP_SUFFIX:
        where = cell.span(file, lead + close + 1, max(len(suffix), 1))
        raise PipeSyntaxError(f"{text!r}: expected {OVERLAP_SUFFIX!r} after ')', found {suffix!r}", where)
    actions, offset = [], lead + 1
    for part in text[1:close].split(";"):
        inner = len(part) - len(part.lstrip())
        action = parse_token(part.strip(), cell.span(file, offset + inner, max(len(part.strip()), 1)))
        if not action.is_compute:
            raise PipeSyntaxError(f"{text!r}: an overlap holds only F, B, I, W actions, not {str(action)!r}",
                                  cell.span(file, offset + inner, len(part.strip())))
        actions.append(action)
        offset += len(part) + 1
    return Step(tuple(actions), overlap=True, span=whole)


def parse_token(token: str, span: Span) -> Action:
    try:
        action = parse_action(token)
    except ValueError as error:
        raise PipeSyntaxError(str(error), span) from None
    if "@" in token:
        raise PipeSyntaxError(f"{token!r}: torch CSV has no chains; write the action without '@'", span)
    return action


class Extent(NamedTuple):
    """What the cells say about the shape: the largest stage and microbatch, and who holds each stage."""

    last_stage: tuple[Action, Span] | None
    last_microbatch: tuple[Action, Span] | None
    owners: dict[int, tuple[int, Span, Action]]

    @staticmethod
    def of(programs) -> Extent:
        """The owner of a stage is the rank of its compute actions; of a stage without any, the
        rank of its other actions. Other actions elsewhere are left to ``verify``'s placement rules
        (as from a .pipe file): only compute actions on two ranks leave the placement unknown."""
        last_stage = last_microbatch = None
        owners: dict[int, tuple[int, Span, Action]] = {}
        others: dict[int, tuple[int, Span, Action]] = {}
        top_stage = top_microbatch = -1
        for rank, program in enumerate(programs):
            for step in program:
                for action in step.actions:
                    stage, kind, microbatch, _ = action
                    if stage > top_stage:
                        last_stage, top_stage = (action, step.span), stage
                    if microbatch is not None and microbatch > top_microbatch:
                        last_microbatch, top_microbatch = (action, step.span), microbatch
                    compute = kind in COMPUTE_KINDS
                    first = (owners if compute else others).setdefault(stage, (rank, step.span, action))
                    if first[0] != rank and compute:
                        raise two_ranks_error(first, rank, step.span, action)
        for stage, first in others.items():
            owners.setdefault(stage, first)
        return Extent(last_stage, last_microbatch, owners)


def two_ranks_error(first: tuple[int, Span, Action], rank: int, span: Span, action: Action) -> SemanticError:
    return SemanticError(
        f"stage {action.stage} appears on two ranks: {str(first[2])!r} on rank {first[0]} at {first[1]} "
        f"and {str(action)!r} on rank {rank} at {span}; a stage runs on one rank",
        span,
        notes=(f"first seen at {first[1]}",),
    )


def infer_count(what: str, stated: int | None, largest: tuple[Action, Span] | None, index_of, file: str) -> int:
    """``stated`` checked against the largest index in the cells, or that index + 1."""
    if stated is not None and not 1 <= stated <= MAX_COUNT:
        raise ArgumentError(Argument(what), f"must be between 1 and {MAX_COUNT}, got {stated}", value=stated,
                            message=words(Argument(what), f" must be between 1 and {MAX_COUNT}, got {stated}"))
    if largest is None:
        if stated is None:
            raise SemanticError(words(f"{file}: no cell names any {what}; state ", Argument(what)))
        return stated
    action, span = largest
    index = index_of(action)
    if stated is None and index >= MAX_COUNT:
        noun = "stage" if what == "stages" else "microbatch"
        raise SemanticError(f"{str(action)!r} names {noun} {index}; the number of {what} must be at most "
                            f"{MAX_COUNT}", span)
    if stated is None:
        return index + 1
    if index >= stated:
        noun = "stage" if what == "stages" else "microbatch"
        raise SemanticError(words(f"{str(action)!r} names {noun} {index}, but ", Argument(what, value=str(stated)),
                                  f" allows 0..{stated - 1}"), span)
    return stated


def resolve_placement(stated: str | None, owners, stages: int, ranks: int, file: str) -> Placement:
    """The placement the cells imply, or the stated one checked against the cells."""
    if stated is None:
        return inferred_placement(owners, stages, file)
    if stated not in ("loop", "v"):
        raise ArgumentError(Argument("placement", value=repr(stated)),
                            "expected 'loop' or 'v' (leave it out to infer the placement)", value=stated)
    placement = Placement.loop(stages, ranks) if stated == "loop" else Placement.v(stages, ranks)
    for stage, (rank, span, action) in sorted(owners.items()):
        expected = placement.rank_of(stage)
        if rank != expected:
            raise SemanticError(f"{str(action)!r} is on rank {rank}, but placement {stated} puts stage {stage} "
                                f"on rank {expected}", span)
    return placement


def inferred_placement(owners, stages: int, file: str) -> Placement:
    if len(owners) < stages:
        absent = next(s for s in range(stages) if s not in owners)
        raise SemanticError(words(f"{file}: stage {absent} appears in no cell, so its rank is unknown; state ",
                                  Argument("placement"), " loop or v"))
    return Placement(tuple(owners[s][0] for s in range(stages)))


def schedule_name(filename: str) -> str:
    name = re.sub(r"\W", "_", Path(filename).stem) or "schedule"
    return name if not name[0].isdigit() else f"s_{name}"


# ---------------------------------------------------------------- writing


def write_csv(schedule: Schedule, path: str | os.PathLike, format: str = "compute_only") -> None:
    """Write ``to_csv_text`` to ``path`` atomically (a temporary file, then a rename)."""
    write_atomically(path, to_csv_text(schedule, format))


def to_csv_text(schedule: Schedule, format: str = "compute_only") -> str:
    """The schedule as torch CSV text, written as torch's ``_dump_csv`` writes it.

    ``compute_only`` writes compute steps and idle cells. Of a schedule with
    written communication it is the schedule before lowering: sends, receives,
    REDUCE_GRAD, UNSHARD and RESHARD are dropped. Of a schedule without, stage-only
    actions stay where they are written (torch's single-stage schedules end each
    row with REDUCE_GRAD). ``compute_comms`` writes every action, a group as
    consecutive cells, and no idle cells; a schedule without written
    communication is lowered first (``pipeforge.passes.lower``).
    """
    if format not in FORMATS:
        raise UsageError(f"format {format!r}: expected 'compute_only' or 'compute_comms'")
    refuse_chains(schedule)
    refuse_kinds(schedule)
    if format == "compute_comms" and not has_communication(schedule):
        schedule = lower(schedule)
    keep_stage_only = format == "compute_comms" or not has_communication(schedule)
    import csv  # here: reading (verify's start-up) needs neither
    import io

    out = io.StringIO()
    writer = csv.writer(out)
    for program in schedule.programs:
        writer.writerow(program_cells(program, format, keep_stage_only))
    return out.getvalue()


def refuse_chains(schedule: Schedule) -> None:
    for rank, index, action in schedule.actions():
        if action.chain:
            raise PipeforgeError(
                f"torch CSV has no chains; {str(action)!r} (rank {rank}, step {index}) belongs to chain "
                f"{action.chain} of the bidirectional schedule {schedule.name!r}. Export it as .pipe or .json instead"
            )
    if schedule.chains > 1:
        raise PipeforgeError(f"torch CSV has no chains; {schedule.name!r} declares {schedule.chains}")


# the kinds torch's _ComputationType has (R, OFFLOAD and RELOAD have no counterpart there)
TORCH_KINDS = frozenset({"F", "B", "I", "W", "SEND_F", "RECV_F", "SEND_B", "RECV_B", "REDUCE_GRAD", "UNSHARD",
                         "RESHARD"})


def refuse_kinds(schedule: Schedule) -> None:
    for rank, index, action in schedule.actions():
        if action.kind.value not in TORCH_KINDS:
            place = f"rank {rank}, step {index}"
            span = schedule.programs[rank][index].span
            if span is not None:
                place += f", {span.file}:{span.line}:{span.col}"
            raise PipeforgeError(
                f"torch CSV has no {action.kind.value} action: {str(action)!r} ({place}) of {schedule.name!r} "
                f"cannot be written for torch's runtime, which recomputes and offloads nothing itself. "
                f"Export it as .pipe or .json instead, or drop the {action.kind.value} actions")


def has_communication(schedule: Schedule) -> bool:
    """True when the schedule spells out sends and receives."""
    return any(action.is_comm for _, _, action in schedule.actions())


def program_cells(program: tuple[Step, ...], format: str, keep_stage_only: bool) -> list[str]:
    cells: list[str] = []
    for step in program:
        cells.extend(step_cells(step, format, keep_stage_only))
    return cells


def step_cells(step: Step, format: str, keep_stage_only: bool) -> list[str]:
    if step.is_idle:
        return [""] if format == "compute_only" else []
    if step.overlap:
        return ["(" + ";".join(map(str, step.actions)) + ")" + OVERLAP_SUFFIX]
    if step.is_compute:
        return [str(step.actions[0])]
    if step.is_group:
        return [str(action) for action in step.actions] if format == "compute_comms" else []
    return [str(action) for action in step.actions] if keep_stage_only else []
