"""Every tensor split into microbatches splits like the batch, checked across ranks.

``BatchRows(info, rank).agree(transport, named)`` on the first call learns the batch's rows from the
lowest rank holding stage 0 (every other rank answers, and all refuse together); ``problem_known(named)``
checks later calls against them (the step's greeting carries the refusal). ``named_tensors`` lists a
call's split tensors with their rows. A tensor splits like the batch (``splits_like``) when its rows are
the batch's or a whole multiple ``k`` whose microbatches are ``k`` times the batch's (a flattened
per-token target); anything else is a ``PipelineUsageError`` naming the rank and the argument.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from pipeforge.runtime.context import ScheduleInfo
from pipeforge.runtime.p2p import PipelineUsageError, Transfer, Transport


def tensors_with_rows(value: Any, where: str) -> list[tuple[str, int]]:
    """Every tensor the microbatch split cuts on dim 0 in ``value``, as (where, rows)."""
    if isinstance(value, torch.Tensor):
        return [(where, value.size(0))] if value.dim() > 0 else []
    if isinstance(value, Mapping):
        return [found for key, item in value.items() for found in tensors_with_rows(item, f"{where}[{key!r}]")]
    if isinstance(value, (tuple, list)):
        return [found for index, item in enumerate(value) for found in tensors_with_rows(item, f"{where}[{index}]")]
    return []


def microbatch_rows(rows: int, chunks: int) -> list[int]:
    """The rows of each microbatch ``torch.tensor_split`` cuts ``rows`` into."""
    return [rows // chunks + (1 if index < rows % chunks else 0) for index in range(chunks)]


def splits_like(rows: int, batch_rows: int, chunks: int) -> bool:
    if batch_rows <= 0 or rows % batch_rows:
        return False
    factor = rows // batch_rows
    return microbatch_rows(rows, chunks) == [factor * r for r in microbatch_rows(batch_rows, chunks)]


class BatchRows:
    """One pipeline's batch rows, learned on its first call."""

    def __init__(self, info: ScheduleInfo, rank: int):
        self.info = info
        self.rank = rank
        firsts = sorted({info.rank_of(0, chain) for chain in range(len(info.placements))})
        self.source = firsts[0]
        self.rows: int | None = None

    def problem_known(self, named: list[tuple[str, int, bool]]) -> str | None:
        """Once the rows are known: what is wrong with a tensor that does not split like the batch (the step's
        greeting tells the neighbours, and every one refuses: ``recovery.StepStart.begin``)."""
        return self._problem(named, self.rows) if self.rows is not None else None

    def agree(self, transport: Transport, named: list[tuple[str, int, bool]], start: Any = None) -> None:
        """The first call: learn the batch's rows from the source rank, every rank refusing together.
        ``start`` (a ``recovery.StepStart``): a refusing rank leaves its record on the store before it answers
        (``start.tell``), and the others raise what it says (``start.refused_by``)."""
        if self.rows is not None:
            return
        if self.info.ranks == 1:
            problem = self._problem(named, self._batch_rows(named))
            if problem:
                raise PipelineUsageError(problem)
            self.rows = self._batch_rows(named)
            return None
        if self.rank == self.source:
            return self._send(transport, named, start)
        return self._receive(transport, named, start)

    def _send(self, transport: Transport, named: list[tuple[str, int, bool]], start: Any) -> None:
        rows = self._batch_rows(named)
        problem = self._problem(named, rows)
        if problem:
            _tell(start, transport, problem)
        peers = [r for r in range(self.info.ranks) if r != self.rank]
        word = torch.tensor([rows, int(problem is not None)], dtype=torch.int64, device=transport.device)
        answers = {peer: torch.zeros(1, dtype=torch.int64, device=transport.device) for peer in peers}
        transport.exchange([t for p in peers for t in (Transfer(True, word, p), Transfer(False, answers[p], p))],
                           "the batch's rows")
        if problem:
            raise PipelineUsageError(problem)
        refused = [peer for peer, answer in answers.items() if answer.item()]
        if refused:
            raise _refused(start, transport, refused[0], f"rank {self.rank}: rank {refused[0]} refused this step: one "
                           f"of its tensors does not split like the batch of {rows} rows (its error names it)")
        self.rows = rows

    def _receive(self, transport: Transport, named: list[tuple[str, int, bool]], start: Any) -> None:
        word = torch.zeros(2, dtype=torch.int64, device=transport.device)
        transport.exchange([Transfer(False, word, self.source)], "the batch's rows")
        rows, source_refused = int(word[0].item()), bool(word[1].item())
        problem = self._problem(named, rows) if not source_refused else None
        if problem:
            _tell(start, transport, problem)
        answer = torch.tensor([int(problem is not None)], dtype=torch.int64, device=transport.device)
        transport.exchange([Transfer(True, answer, self.source)], "the answer to the batch's rows")
        if problem:
            raise PipelineUsageError(problem)
        if source_refused:
            raise _refused(start, transport, self.source, f"rank {self.rank}: rank {self.source} refused this step: "
                           "a tensor of its batch does not split like the batch (its error names it)")
        self.rows = rows

    def _batch_rows(self, named: list[tuple[str, int, bool]]) -> int:
        batch = [rows for _, rows, of_batch in named if of_batch]
        return batch[0] if batch else 0

    def _problem(self, named: list[tuple[str, int, bool]], rows: int) -> str | None:
        chunks = self.info.microbatches
        for where, count, _ in named:
            if rows and count != rows and not splits_like(count, rows, chunks):  # the batch's rows always split
                return (f"rank {self.rank}: {where} has {count} rows and the batch {rows}: a tensor split into "
                        f"{chunks} microbatches must split like the batch (the batch's rows, or a whole multiple "
                        f"of them whose microbatches are that multiple of the batch's {microbatch_rows(rows, chunks)})")
        return None


def _tell(start: Any, transport: Transport, problem: str) -> None:
    if start is not None:
        start.tell(transport, PipelineUsageError(problem))


def _refused(start: Any, transport: Transport, peer: int, fallback: str) -> PipelineUsageError:
    told = start.refused_by(transport, peer, "word on the batch's rows") if start is not None else None
    return told if told is not None and peer == getattr(told, "failed_rank", None) else PipelineUsageError(fallback)


def named_tensors(args: tuple, kwargs: Mapping, target: Any, shared: Any, per_stage: Any,
                  stages: Sequence[int]) -> list[tuple[str, int, bool]]:
    """Every tensor of a call that is split into microbatches: (its name as errors give it, rows, of the
    batch); the batch's first. ``stages``: the stages this rank holds (the ``stage_kwargs`` it uses)."""
    named = [(w, r, True) for index, value in enumerate(args)
             for w, r in tensors_with_rows(value, f"step()/eval() argument {index}")]
    if kwargs:
        named += [(w, r, True) for key, value in kwargs.items()
                  for w, r in tensors_with_rows(value, f"step()/eval() keyword {key!r}")]
    if target is not None:
        named += [(w, r, False) for w, r in tensors_with_rows(target, "target")]
    if shared is not None and isinstance(shared, Mapping):
        named += [(w, r, False) for key, value in shared.items()
                  for w, r in tensors_with_rows(value, f"shared_kwargs[{key!r}]")]
    if per_stage is not None and isinstance(per_stage, Mapping):
        for stage in stages:
            inputs = per_stage.get(stage)
            if isinstance(inputs, Mapping):
                named += [(w, r, False) for key, value in inputs.items()
                          for w, r in tensors_with_rows(value, f"stage_kwargs[{stage}][{key!r}]")]
    return named
