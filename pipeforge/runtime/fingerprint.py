"""Ranks agree on what they run before they compute.

``agree(info, programs, rank, transport)``, at ``make_pipeline``: this rank's program is recorded
(``record``: the calls its rank function makes, as actions) and checked against ``SCHEDULE``
(``check_program``), then its ``fingerprint`` (version, schedule, sizes, placement, ``PARAMS``, a digest
of the rank functions, forwards per stage, the messages to and from each peer in order) is exchanged with
every other rank; on any difference every rank raises ``PipelineUsageError`` naming the ranks and what
differs (``disagreement``). Needs only ``SCHEDULE``, the rank functions and their module's ``PARAMS``.
What is compared and why: ``docs/runtime-internals.md`` (Ranks agree).
"""

from __future__ import annotations

import hashlib
import json
import sys
from collections import Counter
from collections.abc import Callable, Mapping
from pathlib import Path
from types import CodeType
from typing import Any

import torch

from pipeforge.ir import COMM_KINDS, Action, ActionKind
from pipeforge.runtime.context import ScheduleInfo, posted
from pipeforge.runtime.p2p import PipelineUsageError, Transfer, Transport
from pipeforge.semantics import RUNTIME_METHODS, SENDS, partner, peer_stage

KINDS = {method: kind for kind, method in RUNTIME_METHODS.items()}
COMMS = COMM_KINDS
F, B, I, W = ActionKind.F, ActionKind.B, ActionKind.I, ActionKind.W


class _Overlap:
    def __init__(self, recorder: Recorder):
        self.recorder = recorder

    def __enter__(self) -> None:
        self.recorder.calls.append("overlap(")

    def __exit__(self, *exc) -> None:
        self.recorder.calls.append(")")


class Recorder:
    """Stands in for the rank context: every call a rank function makes, kept in order.

    ``actions``: the compute and stage actions, and the communication actions in the order they are
    posted; ``calls``: every call as text (what the digest is of), unknown methods included."""

    def __init__(self, rank: int = 0) -> None:
        self.rank = rank  # (what a refused post names)
        self.actions: list[Action] = []
        self.calls: list[str] = []

    def __getattr__(self, name: str) -> Callable:
        if name.startswith("_"):
            raise AttributeError(name)
        if name == "overlap":
            return lambda: _Overlap(self)
        if name == "post":
            return self._post
        kind = KINDS.get(name)
        return lambda *args, **kwargs: self._call(name, kind, args, kwargs)

    def _call(self, name: str, kind: ActionKind | None, args: tuple, kwargs: dict) -> Action | None:
        action = _action(kind, args, kwargs) if kind is not None else None
        if action is not None and kind in COMMS:
            return action  # posted (and recorded) by post()
        self.calls.append(f"{name}{args!r}{sorted(kwargs.items())!r}")
        if action is not None:
            self.actions.append(action)
        return None

    def _post(self, *comms: Any) -> None:
        group = posted(comms, self.rank)  # (the runtime's reading: tokens or actions, the same calls text)
        self.calls.append(f"post{tuple(map(tuple, group))!r}")
        self.actions.extend(group)


def _action(kind: ActionKind, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Action:
    stage: Any = args[0] if args else kwargs.get("stage")  # as the program passed it (a Recorder checks nothing)
    if kind.has_microbatch:  # every kind but the stage-only ones (ir.STAGE_ONLY_KINDS)
        mb = args[1] if len(args) > 1 else kwargs.get("mb")
        chain = args[2] if len(args) > 2 else kwargs.get("chain", 0)
    else:  # REDUCE_GRAD, UNSHARD, RESHARD: a stage and a chain
        mb, chain = None, args[1] if len(args) > 1 else kwargs.get("chain", 0)
    return Action(stage, kind, mb, chain)


def record(program: Callable, rank: int = 0) -> Recorder:
    """The calls ``program`` (a generated rank function, rank ``rank``'s) makes, in order."""
    recorder = Recorder(rank)
    program(recorder)
    return recorder


def module_digest(programs: Mapping[int, Callable]) -> str:
    """A digest of the rank functions' code (their instructions and constants, not their line numbers)."""
    digest = hashlib.sha256()
    for rank in sorted(programs):
        digest.update(f"rank {rank}\n".encode())
        code = getattr(programs[rank], "__code__", None)
        if code is not None:
            _digest_code(code, digest)
    return digest.hexdigest()[:16]


def _module_digest(programs: Mapping[int, Callable], info: ScheduleInfo) -> str | None:
    """What identifies the module's rank programs without loading another rank's: the digest codegen put in
    the rank modules' folder name (``runtime.RankModules``), or a digest of every rank function a dict holds
    (None for a dict holding only some)."""
    folder = getattr(programs, "folder", None)
    if folder is not None:
        return Path(folder).name.rpartition("_ranks_")[2] or None
    if isinstance(programs, dict) and sorted(programs) == list(range(info.ranks)):
        return module_digest(programs)
    return None


def _params(programs: Mapping[int, Callable], program: Callable) -> Any:
    """The generated module's ``PARAMS``: in the rank function's module, or in the module whose ``PROGRAMS``
    the rank modules are."""
    params = getattr(program, "__globals__", {}).get("PARAMS")
    if params is None and hasattr(programs, "folder"):
        owner = next((m for m in list(sys.modules.values()) if getattr(m, "PROGRAMS", None) is programs), None)
        params = getattr(owner, "PARAMS", None)
    return params


def _digest_code(code: CodeType, digest) -> None:
    digest.update(code.co_code)
    digest.update(repr(code.co_names).encode())
    for constant in code.co_consts:
        if isinstance(constant, CodeType):
            _digest_code(constant, digest)
        else:
            digest.update(repr(constant).encode())


# -- the rank's own program against SCHEDULE -------------------------------------------


def check_program(info: ScheduleInfo, rank: int, actions: list[Action]) -> str | None:
    """What is wrong with rank ``rank``'s program given ``info`` (None when nothing is)."""
    where = f"the module's program for rank {rank}"
    seen: Counter = Counter()
    for action in actions:
        stage, _, mb, chain = action
        if not (isinstance(chain, int) and 0 <= chain < len(info.placements)):
            return f"{where} runs {_text(action)} in chain {chain}; SCHEDULE has {len(info.placements)} chain(s)"
        if not (isinstance(stage, int) and 0 <= stage < info.stages):
            return f"{where} runs {_text(action)}; SCHEDULE has stages 0..{info.stages - 1}"
        if mb is not None and not (isinstance(mb, int) and 0 <= mb < info.microbatches):
            return (f"{where} runs {_text(action)}; SCHEDULE says {info.microbatches} microbatches "
                    f"(0..{info.microbatches - 1})")
        owner = info.rank_of(stage, chain)  # a communication action names this rank's own stage too
        if mb is None and stage in info.stages_of(rank):
            owner = rank  # REDUCE_GRAD, UNSHARD, RESHARD name a stage: its replicas here in any chain
        if owner != rank:
            return f"{where} runs {_text(action)}, which SCHEDULE places on rank {owner}"
        if mb is not None:
            seen[action] += 1
            if seen[action] > 1:
                return f"{where} runs {_text(action)} twice"
    return _check_counts(info, rank, seen, where)


def _check_counts(info: ScheduleInfo, rank: int, seen: Counter, where: str) -> str | None:
    for (stage, kind, mb, chain) in sorted(seen, key=lambda a: (a[3], a[0], a[2], a[1].value)):
        if kind is F and not (seen[(stage, B, mb, chain)] or seen[(stage, I, mb, chain)]):
            return f"{where} runs {_text(Action(stage, F, mb, chain))} but never its backward"
        if kind is I and not seen[(stage, W, mb, chain)]:
            return f"{where} runs {_text(Action(stage, I, mb, chain))} but never its W"
        if kind in (B, I, W) and not seen[(stage, F, mb, chain)]:
            return f"{where} runs {_text(Action(stage, kind, mb, chain))} without its forward"
    for stage in range(info.stages):
        chains = [c for c in range(len(info.placements)) if info.rank_of(stage, c) == rank]
        if not chains or len(chains) < len(info.placements):
            continue  # the other chain's rank runs some of the microbatches: counted across ranks
        done = sorted(mb for (s, kind, mb, _) in seen if s == stage and kind is F)
        if done != list(range(info.microbatches)):
            return (f"{where} forwards microbatches {_ranges(done)} on stage {stage}; SCHEDULE says "
                    f"{info.microbatches} microbatches (0..{info.microbatches - 1}): edited or truncated")
    return None


# -- the fingerprint and its comparison ---------------------------------------------------


def fingerprint(info: ScheduleInfo, programs: Mapping[int, Callable], rank: int) -> dict:
    """What this rank will run, as plain data (JSON): see the module docstring."""
    from pipeforge import __version__

    program = programs[rank]
    try:
        recorder = record(program, rank)
        problem = check_program(info, rank, recorder.actions)
    except Exception as error:  # noqa: BLE001 (a module edited into something that does not even run)
        recorder, problem = Recorder(), f"the module's program for rank {rank} fails: {type(error).__name__}: {error}"
    sends: dict[int, list] = {}
    receives: dict[int, list] = {}
    for action in recorder.actions:
        if action.kind in COMMS:
            peer = info.rank_of(peer_stage(action), action.chain)
            if action.kind in SENDS:
                sends.setdefault(peer, []).append(list(partner(action)))
            else:
                receives.setdefault(peer, []).append(list(action))
    params = _params(programs, program)
    return {
        "version": __version__,
        "schedule": info.name, "ranks": info.ranks, "stages": info.stages, "microbatches": info.microbatches,
        "placements": [list(p) for p in info.placements],
        "params": sorted(params.items()) if isinstance(params, Mapping) else None,
        "module": _module_digest(programs, info),
        "program": hashlib.sha256("\n".join(recorder.calls).encode()).hexdigest()[:16],
        "forwards": sorted(Counter(a.stage for a in recorder.actions if a.kind is F).items()),
        "sends": {str(peer): _plain(actions) for peer, actions in sends.items()},
        "receives": {str(peer): _plain(actions) for peer, actions in receives.items()},
        "problem": problem,
    }


def _plain(actions: list) -> list:
    return [[s, getattr(kind, "value", kind), m, c] for s, kind, m, c in actions]


FIELDS = (("version", "pipeforge version"), ("schedule", "schedule"), ("ranks", "ranks"), ("stages", "stages"),
          ("microbatches", "microbatches"), ("placements", "placements"), ("params", "PARAMS"),
          ("module", "module (a digest of its rank functions)"))


def disagreement(prints: dict[int, dict], info: ScheduleInfo) -> str | None:
    """The first way the ranks' fingerprints disagree, naming the ranks (None when they agree)."""
    for rank, mine in sorted(prints.items()):
        if mine["problem"] is not None:
            return f"rank {rank}'s module is not what its SCHEDULE says: {mine['problem']}"
    ranks = sorted(prints)
    for field, what in FIELDS:
        for other in ranks[1:]:
            a, b = prints[ranks[0]][field], prints[other][field]
            if a is not None and b is not None and a != b:
                return f"rank {ranks[0]} and rank {other} run different pipelines: {what} {_show(a)} on rank " \
                       f"{ranks[0]}, {_show(b)} on rank {other}"
    for sender in ranks:
        for receiver in ranks:
            problem = _unpaired(prints, sender, receiver)
            if problem:
                return problem
    return _unsummed(prints, info)


def _unpaired(prints: dict[int, dict], sender: int, receiver: int) -> str | None:
    sent = prints[sender]["sends"].get(str(receiver), [])
    taken = prints[receiver]["receives"].get(str(sender), [])
    for index, (a, b) in enumerate(zip(sent, taken)):
        if a != b:
            return (f"rank {sender} and rank {receiver} run programs that do not pair: message {index + 1} rank "
                    f"{sender} sends rank {receiver} is for {_text(tuple(a))}, but rank {receiver}'s program posts "
                    f"{_text(tuple(b))} there")
    if len(sent) != len(taken):
        return (f"rank {sender} and rank {receiver} run programs that do not pair: rank {sender} sends rank "
                f"{receiver} {len(sent)} messages, rank {receiver}'s program receives {len(taken)} from it")
    return None


def _unsummed(prints: dict[int, dict], info: ScheduleInfo) -> str | None:
    total: Counter = Counter()
    for mine in prints.values():
        for stage, count in mine["forwards"]:
            total[stage] += count
    for stage in range(info.stages):
        if total[stage] != info.microbatches:
            return (f"the ranks' programs forward {total[stage]} microbatches on stage {stage}; SCHEDULE says "
                    f"{info.microbatches}: a module was edited or truncated")
    return None


def agree(info: ScheduleInfo, programs: Mapping[int, Callable], rank: int, transport: Transport) -> None:
    """Refuse, on every rank together, to run programs that are not one schedule (module docstring)."""
    mine = json.loads(json.dumps(fingerprint(info, programs, rank)))  # as the peers will read it
    prints = {rank: mine}
    peers = [r for r in range(info.ranks) if r != rank]
    if peers:
        prints.update(_exchange(transport, mine, peers))
    problem = disagreement(prints, info)
    if problem is not None:
        raise PipelineUsageError(f"rank {rank}: {problem}; every rank must run the module generated from one "
                                 "schedule, unedited: regenerate the modules and copy the same one to every rank")


def _exchange(transport: Transport, mine: dict, peers: list[int]) -> dict[int, dict]:
    """``mine`` to every peer and theirs from each: lengths first, then the JSON bytes."""
    payload = torch.frombuffer(bytearray(json.dumps(mine).encode()), dtype=torch.uint8).to(transport.device)
    length = torch.tensor([payload.numel()], dtype=torch.int64, device=transport.device)
    lengths = {peer: torch.zeros_like(length) for peer in peers}
    transport.exchange([t for peer in peers
                        for t in (Transfer(True, length, peer), Transfer(False, lengths[peer], peer))],
                       "the lengths of the ranks' fingerprints")
    theirs = {peer: torch.empty(int(lengths[peer].item()), dtype=torch.uint8, device=transport.device)
              for peer in peers}
    transport.exchange([t for peer in peers
                        for t in (Transfer(True, payload, peer), Transfer(False, theirs[peer], peer))],
                       "the ranks' fingerprints (what each will run)")
    return {peer: json.loads(bytes(theirs[peer].cpu().tolist()).decode()) for peer in peers}


def _text(action: tuple) -> str:
    stage, kind, mb, chain = action
    kind = getattr(kind, "value", kind)
    return f"{stage}{kind}{'' if mb is None else mb}" + (f"@{chain}" if chain else "")


def _show(value: Any) -> str:
    text = json.dumps(value)
    return text if len(text) <= 120 else text[:117] + "..."


def _ranges(values: list[int]) -> str:
    """``[0, 1, 2, 5]`` as ``0..2, 5``."""
    runs: list[list[int]] = []
    for value in values:
        if runs and value == runs[-1][-1] + 1:
            runs[-1].append(value)
        else:
            runs.append([value])
    return ", ".join(f"{r[0]}" if len(r) == 1 else f"{r[0]}..{r[-1]}" for r in runs) or "none"
