"""Codegen: a verified, lowered schedule rendered into Python modules.

``codegen(schedule, output, name=None, force=False)`` writes ``OUT.py`` (or ``DIR/<name>.py``: ``SCHEDULE``,
``stages_of_rank``, ``make_pipeline``; ``templates/pipeline.py.j2``, importing only torch and
``pipeforge.runtime``) and beside it ``<name>_ranks_<digest>/rank_<r>.py``, each rank's function, all or
nothing, replacing only the module of the same schedule unless ``force``; ``generate`` returns one module of
every rank instead (``docs/runtime.md``). Each step is commented with its torch token, ``file:line:col`` and
verify's step index unless ``locations=False``. Nothing from the schedule reaches code but an ``Ident``, a
printable one-line ``Comment`` and ``repr()`` of an int, finite float, str, bool or None (jinja2's
``finalize``; else ``CodegenError``). Compiled before written; the same schedule gives the same bytes.
"""

from __future__ import annotations

import ast
import contextlib
import gc
import hashlib
import itertools
import keyword
import math
import os
import re
import shutil
import signal
import sys
import tempfile
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from functools import cache
from operator import attrgetter, itemgetter
from pathlib import Path
from types import CodeType
from typing import NamedTuple

import jinja2

from pipeforge.errors import Argument, ArgumentError, CodegenError, UsageError, VerificationError, words
from pipeforge.bytecode import CompileError, Compiling, available_cores, write_cached
from pipeforge.files import check_replaceable as check_output_replaceable
from pipeforge.files import locked_output, module_head, parse_module_head, umask
from pipeforge.ir import COMM_KINDS, Action, ActionKind, Schedule, Step
from pipeforge.passes.lower import Lowered, lower_with_origins
from pipeforge.resources import templates_dir
from pipeforge.semantics import (RUNTIME_METHODS, Semantics, effects_of, offload_waits, offloaded, recomputed,
                                 waited_offload)
from pipeforge.verifier import holds, verify

TEMPLATE = "pipeline.py.j2"  # the module a user loads
RANK_TEMPLATE = "rank.py.j2"  # one rank's module beside it (the body of each rank function: body_text)
DIGEST_LENGTH = 12  # hex digits of the rank modules' digest in their folder's name
RUNTIME_SEMANTICS = (Semantics.RENDEZVOUS, Semantics.BUFFERED)  # what generated code may be verified under


class Ident(str):
    """A validated Python identifier: the only text the templates emit verbatim."""

    def __new__(cls, text: str) -> Ident:
        if not isinstance(text, str) or not text.isidentifier() or keyword.iskeyword(text):
            raise CodegenError(f"{text!r} is not a Python identifier")
        return super().__new__(cls, text)


class Comment(str):
    """A step's comment, ``# 0F1 x.pipe:8:9 step 2``, built by ``step_comment`` from a validated file name,
    integers and torch tokens: printable, one line, starting with ``# ``."""

    def __new__(cls, text: str) -> Comment:
        if not isinstance(text, str) or not text.startswith("# ") or not text.isprintable():
            raise CodegenError(f"{text!r} is not a one-line comment")
        return super().__new__(cls, text)


class Ints(tuple):
    """Integers printed as ``0, 1, 2`` (arguments, a placement's row): each one ``repr()`` of an int."""

    def __new__(cls, values) -> Ints:
        return super().__new__(cls, _ints(tuple(values)))


def finalize(value: object) -> str:
    """What ``{{ ... }}`` may print: identifiers, comments and a rank function's body (``body_text``: calls
    of the rank context, made of identifiers, integers, token literals and comments) as they are, literals
    as ``repr()``, and a row of integers."""
    if isinstance(value, (Ident, Comment, Body)):
        return str(value)
    if value is None or isinstance(value, (bool, int, str)):
        return repr(value)
    if isinstance(value, float) and math.isfinite(value):
        return repr(value)
    if isinstance(value, Ints):
        return ", ".join(map(repr, value))
    raise CodegenError(f"codegen refuses to emit {type(value).__name__} {value!r}: not an identifier or a literal")


@cache
def environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(templates_dir())),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        autoescape=False,
        finalize=finalize,
    )
    env.filters.update(FILTERS)
    return env


# -- the view the template reads --------------------------------------------------


class Body(str):
    """A rank function's body, made by ``body_text`` alone from identifiers (``METHODS``), integers,
    ``repr()`` of torch tokens (made of kind names and integers) and ``Comment``s: printed as it is."""


class RankView(NamedTuple):
    rank: int
    body: Body


METHODS = RUNTIME_METHODS  # kind -> the RankContext method generated code calls (pipeforge.semantics)
_METHOD_IDENTS = {kind: Ident(method) for kind, method in METHODS.items()}
_KIND_NAMES = {kind: Ident(kind.value) for kind in METHODS}
SAFE_FILE = re.compile(r"[\w.+@-]+")  # a file name shown as it is in a comment; any other as its repr()


@cache
def file_text(path: str) -> str:
    """The file name as a comment shows it: ``zbv.pipe`` (an editor links ``zbv.pipe:22:28``), or its
    ``repr()`` when it holds anything but letters, digits and ``._+@-``."""
    name = Path(path).name
    return name if SAFE_FILE.fullmatch(name) else repr(name)


def action_texts(made: dict[tuple, tuple[str, str, str, str]]) -> Callable[[Action], tuple[str, str]]:
    """``texts(action)``: the action's call, ``forward(5, 3, chain=1)`` (the rank context's method, bound
    to a local name at the function's start: ``bound_methods``), and its torch token, ``5F3@1``, put
    together from parts made once per (kind, stage, chain) and kept in ``made``: the method's ``Ident`` and
    the integers' ``repr()``. A kind without a runtime method, or anything but an int where the schedule
    has integers, is refused (``CodegenError``)."""

    def texts(action: Action) -> tuple[str, str]:
        stage, kind, mb, chain = action
        if type(stage) is not int or type(chain) is not int or (mb is not None and type(mb) is not int):
            _ints((stage, chain) if mb is None else (stage, mb, chain))
        parts = made.get((kind, stage, chain))
        if parts is None:
            parts = made[(kind, stage, chain)] = action_parts(action)
        if mb is None:
            return parts[0] + parts[1], parts[2] + parts[3]
        return f"{parts[0]}, {mb!r}{parts[1]}", f"{parts[2]}{mb!r}{parts[3]}"

    return texts


def action_parts(action: Action) -> tuple[str, str, str, str]:
    """An action's call and token around its microbatch: ``forward(5``, ``, chain=1)``, ``5F``, ``@1``."""
    method = _METHOD_IDENTS.get(action.kind)
    if method is None:
        raise CodegenError(f"codegen does not support {action.kind.value} actions ({action})")
    stage, chain = repr(action.stage), action.chain
    return (f"{method}({stage}", f", chain={chain!r})" if chain else ")",
            f"{stage}{_KIND_NAMES[action.kind]}", f"@{chain!r}" if chain else "")


POST = Ident("post")  # the rank context's method that posts a communication group
GROUP_LINE = 120  # characters of a post on one line, at most; a longer one has a token a line
BOUND_LINE = 110  # characters of a line binding the context's methods, at most (but one name a line at least)


def bound_methods(kinds: Iterable[ActionKind]) -> list[str]:
    """The lines that start a rank function calling the actions of ``kinds``: each context method it
    calls bound once to its own name (``forward, backward = ctx.forward, ctx.backward``), in ``METHODS``'
    order, then ``post`` (a post names its actions by their tokens: ``body_text``). A call per action then
    parses as a name and its integers: CPython's parser keeps every token and memo entry of a module until
    its tree is built, and ``ctx.`` before every call made a fifth of what it held for a large rank
    (docs/runtime.md)."""
    used = set(kinds)
    names = [_METHOD_IDENTS[kind] for kind in METHODS if kind in used and kind not in COMM_KINDS]
    if used & COMM_KINDS:
        names.append(POST)
    lines: list[list[str]] = []
    for position, name in enumerate(names):
        if position and len(_bound(lines[-1] + [name])) <= BOUND_LINE:
            lines[-1].append(name)
        else:
            lines.append([name])
    return [_bound(line) for line in lines]


def _bound(names: list[str]) -> str:
    return f"    {', '.join(names)} = {', '.join(f'ctx.{name}' for name in names)}"


def location_text(span) -> str:
    """`` x.pipe:8:9 step `` of a step's comment (the step's index follows): checked as a ``Comment``."""
    text = f" {file_text(span.file)}:{_int(span.line)}:{_int(span.col)} step "
    return Comment(f"#{text}")[1:]


def body_text(program: tuple[Step, ...], origins: Sequence[int], locations: bool) -> Body:
    """A rank function's body: the context methods it calls bound to their names (``bound_methods``),
    then its steps in order, one call per action, 4 spaces in, lines without the last newline. A step is

        forward(0, 1)  # 0F1 x.pipe:8:9 step 2                      (a compute step)
        post('0SEND_F1')  # 0SEND_F1 x.pipe:8:9 step 2                (a group of one)
        post('0SEND_F1', '0RECV_B0')  # [0SEND_F1 0RECV_B0] x.pipe:8:9 step 2      (a group)
        post(  # [0SEND_F1 0RECV_B0 ...] x.pipe:8:9 step 2           (a group past GROUP_LINE: a token
            '0SEND_F1',                                                 a line, then the parenthesis)
        )
        with ctx.overlap():  # (0F7;0B3) x.pipe:8:9 step 2           (an overlap: each action a line)

    with the comment (torch token(s), ``.pipe`` location, verify's step index ``origins[i]``) unless
    ``locations`` is false or the step has no span; idle steps are left out, and a rank with nothing to do
    gets ``pass``. A post names its actions by their torch tokens as ``repr()`` literals (the runtime parses
    each group once: ``runtime.context.posted``): a constant costs CPython's compiler and parser about half
    of the call ``send_f(0, 1)`` it replaces. A comment is made of tokens (integers and kind names), a location
    checked as a ``Comment`` once per span, and an int."""
    made: dict[tuple, tuple[str, str, str, str]] = {}
    texts = action_texts(made)
    places: dict[int, str] = {}  # id(span) -> its location text (the spans live as long as the program)
    lines: list[str] = []
    add = lines.append
    for position, step in enumerate(program):
        actions = step.actions
        if not actions:
            continue
        span = step.span if locations else None
        if span is not None:
            place = places.get(id(span))
            if place is None:
                place = places[id(span)] = location_text(span)
            index = origins[position]
            if type(index) is not int:
                _int(index)
        if len(actions) == 1:
            call, token = texts(actions[0])
            comment = "" if span is None else f"  # ({token}){place}{index}" if step.overlap else \
                f"  # {token}{place}{index}"
            if step.overlap:
                add(f"    with ctx.overlap():{comment}\n        {call}")
            elif actions[0][1] in COMM_KINDS:
                add(f"    post({token!r}){comment}")
            else:
                add(f"    {call}{comment}")
            continue
        pairs = list(map(texts, actions))
        tokens = [token for _, token in pairs]
        if step.overlap:
            comment = "" if span is None else f"  # ({';'.join(tokens)}){place}{index}"
            add(f"    with ctx.overlap():{comment}\n        " + "\n        ".join([call for call, _ in pairs]))
        elif actions[0][1] in COMM_KINDS:
            comment = "" if span is None else f"  # [{' '.join(tokens)}]{place}{index}"
            literals = list(map(repr, tokens))
            line = f"    post({', '.join(literals)}){comment}"
            if len(line) <= GROUP_LINE:
                add(line)
            else:
                add(f"    post({comment}\n        " + ",\n        ".join(literals) + ",\n    )")
        else:  # (a Step refuses several actions that neither overlap nor communicate)
            raise CodegenError(f"step {step} holds several actions but is neither an overlap nor a group")
    if not lines:
        return Body("    pass")
    return Body("\n".join(bound_methods(kind for kind, _, _ in made) + lines))


def _int(value: object) -> int:
    if type(value) is not int:
        raise CodegenError(f"expected an integer in the schedule, got {value!r}")
    return value


def _ints(values: tuple) -> tuple[int, ...]:
    for value in values:
        if type(value) is not int:
            raise CodegenError(f"expected an integer in the schedule, got {value!r}")
    return values


def rank_function(rank: int) -> Ident:
    """The name of rank ``rank``'s function in the module."""
    return Ident(f"rank_{_int(rank)}")


FILTERS = {"rank_function": rank_function}


# -- rendering and writing ----------------------------------------------------------


# Top-level modules a generated module's folder must not hold a file of: on sys.path (a script beside it,
# ``python -m`` there) it would be imported in their place, by the module itself (torch, pipeforge) or by
# what they import (numpy, the standard library).
SHADOWED = frozenset(sys.stdlib_module_names) | {"torch", "pipeforge", "numpy"}


def module_name(schedule: Schedule) -> Ident:
    """The module's file stem: the schedule name with anything but [A-Za-z0-9_] turned to '_', prefixed
    with ``schedule_`` where it would not be an importable name of its own (a digit first, a keyword, a
    module it would shadow: a schedule named ``torch``)."""
    stem = re.sub(r"\W", "_", schedule.name, flags=re.ASCII).strip("_") or "schedule"
    if stem[0].isdigit() or keyword.iskeyword(stem) or stem in SHADOWED:
        stem = f"schedule_{stem}"
    return Ident(stem)


PLACEMENT_ROW = 16  # stage owners per line of SCHEDULE's placements (lines stay under 120 characters)


@dataclass(frozen=True)
class GeneratedFiles:
    """What codegen writes: the module a user loads (``main``) and, in the folder ``rank_folder`` beside
    it, one module per rank (``ranks[r]`` is ``rank_<r>.py``)."""

    main: str
    rank_folder: str
    ranks: tuple[str, ...]


def _recompute_sources(schedule: Schedule) -> tuple[tuple[int, str], ...]:
    """(stage, ``file:line:col``) of each stage's first R that has a place, for the runtime's errors."""
    found: dict[int, str] = {}
    for program in schedule.programs:
        for step in program:
            span = step.span
            for action in step.actions:
                if action.kind is ActionKind.R and span is not None and action.stage not in found:
                    found[_int(action.stage)] = f"{Path(str(span.file)).name}:{_int(span.line)}:{_int(span.col)}"
    return tuple(sorted(found.items()))


def _context(schedule: Schedule, locations: bool = True) -> dict:
    if len(schedule.programs) != schedule.ranks:
        raise CodegenError(f"schedule {schedule.name!r} declares {schedule.ranks} ranks but has "
                           f"{len(schedule.programs)} programs")
    actions = list(_every_action(schedule))
    kinds = set(map(itemgetter(1), actions))  # (in C: most schedules hold no R nor OFFLOAD to look for)
    rebuilt = recomputed(actions) if ActionKind.R in kinds else set()  # (without R, no recompute sources)
    placements = []
    for placement in schedule.placements:
        owners = _ints(tuple(placement.stage_to_rank))
        placements.append(tuple(Ints(owners[i:i + PLACEMENT_ROW]) for i in range(0, len(owners), PLACEMENT_ROW)))
    return {
        "name": str(schedule.name),
        "ranks": _int(schedule.ranks),
        "stages": _int(schedule.stages),
        "microbatches": _int(schedule.microbatches),
        "placements": tuple(placements),
        "params": tuple((str(name), _int(value)) for name, value in schedule.params),
        # (stage, microbatch, chain) whose F keeps only its checkpoint, and whose forward saves for OFFLOAD
        "recomputed": tuple(_ints(key) for key in sorted(rebuilt)),
        "offloaded": tuple(_ints(key) for key in sorted(offloaded(actions) if ActionKind.OFFLOAD in kinds else ())),
        "recompute_sources": _recompute_sources(schedule) if locations and rebuilt else (),
        "offload_waits": _offload_waits(schedule, actions),
    }


def _offload_waits(schedule: Schedule, actions: list) -> tuple:
    """``ScheduleInfo.offload_waits``: each step that adds memory and the OFFLOAD whose copy it waits for,
    by the copy lane rule (``semantics.offload_waits``) on the schedule's memory spec and limit."""
    memory = schedule.memory
    if memory is None or memory.limit is None or not any(a.kind is ActionKind.OFFLOAD for a in actions):
        return ()
    effect = effects_of(memory, actions)
    found = []
    for program in schedule.programs:
        steps = [[(a, *effect(a)) for a in step.actions] for step in program]
        summary = [(sum(e[1] for e in step), sum(e[2] for e in step),
                    any(e[0].kind is ActionKind.OFFLOAD for e in step)) for step in steps]
        for step, wait in zip(steps, offload_waits(summary, memory.limit)):
            if wait is None:
                continue
            waited = steps[wait]
            gone = waited[waited_offload([e[0].kind for e in waited])][0]
            found += [((_int(a.stage), str(a.kind.value), _int(a.microbatch), _int(a.chain)),
                       _ints((gone.stage, gone.microbatch, gone.chain))) for a, added, _ in step if added > 0]
    return tuple(found)


def _every_action(schedule: Schedule):
    """Every action of the schedule, in C (a generator per action cost a fifth of the rendering)."""
    steps = itertools.chain.from_iterable(schedule.programs)
    return itertools.chain.from_iterable(map(attrgetter("actions"), steps))


def _views(schedule: Schedule, locations: bool, origins: Sequence[Sequence[int]] | None) -> Iterator[RankView]:
    """Each rank's view, made as it is asked for (codegen hands a rank to be compiled as soon as it is
    rendered)."""
    if origins is None:
        origins = tuple(range(len(program)) for program in schedule.programs)
    return (RankView(_int(r), body_text(program, origins[r], locations)) for r, program in enumerate(schedule.programs))


def _compiled(text: str, what: str, filename: str | None = None) -> str:
    _compile(text, what, filename)
    return text


def _compile(text: str, what: str, filename: str | None = None) -> CodeType:
    try:
        return compile(text, filename or f"<pipeforge codegen {what}>", "exec", dont_inherit=True)
    except SyntaxError as error:
        raise CodegenError(f"generated code for {what} does not compile: {error}") from error


def render_module(schedule: Schedule, *, locations: bool = True,
                  origins: tuple[tuple[int, ...], ...] | None = None) -> str:
    """One module holding every rank's function (for ``exec`` at start-up; not verified here: see
    ``generate``).

    ``origins[r][i]`` is the written step that lowered step ``i`` of rank ``r``
    serves (``lower_with_origins``): the index the comments name. Without it a
    step names its own index (the schedule is taken as written).
    """
    context = _context(schedule, locations)
    text = environment().get_template(TEMPLATE).render(
        context, rank_folder=None, programs=tuple(_views(schedule, locations, origins)))
    return _compiled(text, repr(schedule.name))


def render_files(schedule: Schedule, module: str, *, locations: bool = True,
                 origins: tuple[tuple[int, ...], ...] | None = None,
                 rendered: Callable[[str], None] | None = None) -> GeneratedFiles:
    """The module ``module`` (its file stem) and its rank modules for a lowered schedule (not verified
    here; the rank modules are compiled by ``write_files``, where their path is known, or as each is
    rendered: ``rendered(text)`` is called with each rank's text in order). The folder is named after the
    module and the rank modules' text (``<module>_ranks_<digest>``), so a new output never mixes with an
    old one."""
    context = _context(schedule, locations)
    env = environment()
    template = env.get_template(RANK_TEMPLATE)
    main_name = f"{Ident(module)}.py"
    digest = hashlib.sha256()
    ranks = []
    for view in _views(schedule, locations, origins):
        text = template.render(context, program=view, main=main_name)
        ranks.append(text)
        digest.update(text.encode("utf-8"))
        digest.update(b"\0")
        if rendered is not None:
            rendered(text)
    folder = f"{module}_ranks_{digest.hexdigest()[:DIGEST_LENGTH]}"
    main = _compiled(env.get_template(TEMPLATE).render(context, rank_folder=folder, programs=()), repr(schedule.name))
    return GeneratedFiles(main, folder, tuple(ranks))


# as given; a line of Python per action, one module per rank. Chosen to admit issue 23's sizes: ZBV at P=64,
# M=1024 (393,216) takes 20-23 s of CPU with its compile worker and 0.73 GB at its peak, measured 2026-12-01
# (benchmarks/runtime/codegen_scale.py --schedule zbv); interleaved 1F1B there 262,144
MAX_ACTIONS = 400_000


def check_size(schedule: Schedule) -> None:
    """Refuse (before any work) a schedule larger than codegen handles in bounded time and memory."""
    count = schedule.action_count()
    if count > MAX_ACTIONS:
        raise CodegenError(f"schedule {schedule.name!r} has {count} actions; codegen writes modules for at most "
                           f"{MAX_ACTIONS} (each becomes a line of Python, and lowering adds its transfers)")


def _verified_lowering(schedule: Schedule, semantics: Semantics | str) -> Lowered:
    """The lowered schedule, verified (``_lowering``, then ``_verified``)."""
    lowered = _lowering(schedule, semantics)
    _verified(schedule, lowered, semantics)
    return lowered


def _lowering(schedule: Schedule, semantics: Semantics | str) -> Lowered:
    """The schedule lowered once (the arguments and its size checked first)."""
    if semantics not in RUNTIME_SEMANTICS:
        raise ArgumentError(Argument("semantics", value=repr(str(semantics))),
                            f"the runtime follows {' or '.join(RUNTIME_SEMANTICS)}")
    check_size(schedule)
    return lower_with_origins(schedule)


def _verified(schedule: Schedule, lowered: Lowered, semantics: Semantics | str) -> None:
    """Raise ``VerificationError`` unless the schedule verifies: ``pipeforge verify``'s verdict and report
    (a compute-only schedule checked as lowered, its step indices the written ones), on ``lowered`` (not
    lowered again). Only the verdict is needed first, so z3's checks of the plain passes' verdict
    (``certify``: the event pass's timing checked, or on a small schedule decided again; a fifth of
    verifying ZBV at P=64, M=1024) wait for an invalid schedule, for its report."""
    report = verify(schedule, semantics=semantics, certify=False, lowered=lowered)
    if not report.valid:
        report = verify(schedule, semantics=semantics, lowered=lowered)
    if not report.valid:
        raise VerificationError(f"schedule {schedule.name!r} does not verify; no code generated:\n"
                                f"{_report_text(report)}", report=report)


VERIFY_APART_FROM = 50_000  # lowered actions from which codegen, writing no bytecode, verifies in halves (Verifying)


class Verifying:
    """``codegen``'s verdict, made beside its rendering: from ``VERIFY_APART_FROM`` lowered actions, on Linux,
    in a process of one thread with a second core, a forked child (``os.fork``: the lowered schedule is
    shared, not sent) decides one of verify's ``HALVES`` ("timing") and says only whether it holds, while
    this process renders; ``verdict()`` decides the other half here and waits for the child. For any
    answer but "valid" (a half that fails, a child that failed or was killed) it runs ``_verified`` here,
    which makes the report or raises what the child met. Otherwise ``verdict()`` is ``_verified`` itself.
    Leaving the ``with`` block ends a child still running."""

    def __init__(self, schedule: Schedule, lowered: Lowered, semantics: Semantics | str, *, apart: bool = True):
        self.schedule, self.lowered, self.semantics = schedule, lowered, semantics
        self.child: int | None = None
        self.answer: int | None = None  # the pipe the child answers on
        if apart and _can_fork() and lowered.schedule.action_count() >= VERIFY_APART_FROM:
            try:
                self.child, self.answer = _verify_in_child(schedule, lowered, semantics)
            except OSError:  # no process can start here: verified here, after the rendering
                pass

    def __enter__(self) -> Verifying:
        return self

    def __exit__(self, *exc: object) -> None:
        self._end()

    def verdict(self) -> None:
        """Return once the schedule is known valid; raise ``VerificationError`` (with the report) if not."""
        if self.answer is not None:
            try:
                valid = holds(self.schedule, "structure", semantics=self.semantics, lowered=self.lowered) \
                    and os.read(self.answer, 1) == b"1"
            finally:
                self._end()  # (it has answered, or its answer is not needed)
            if valid:
                return
        _verified(self.schedule, self.lowered, self.semantics)

    def _end(self) -> None:
        if self.answer is not None:
            os.close(self.answer)
            self.answer = None
        if self.child is not None:
            try:
                os.kill(self.child, signal.SIGKILL)
            except ProcessLookupError:
                pass
            os.waitpid(self.child, 0)
            self.child = None


def _can_fork() -> bool:
    """A fork that shares the lowered schedule is safe and helps: Linux, one thread (no lock another
    thread holds), and a core for the child besides this process's."""
    return sys.platform.startswith("linux") and threading.active_count() == 1 and available_cores() > 1


def _verify_in_child(schedule: Schedule, lowered: Lowered, semantics: Semantics | str) -> tuple[int, int]:
    """A forked child that writes b"1" (verify's "timing" half holds) or b"0" (it does not) on a pipe and exits;
    any error in it ends it without an answer. Returns its pid and the pipe's reading end."""
    readable, writable = os.pipe()
    try:
        child = os.fork()
    except OSError:
        os.close(readable)
        os.close(writable)
        raise
    if child == 0:  # (the child: never returns; its collector off, so it touches no object it does not read)
        try:
            gc.disable()
            os.close(readable)
            os.write(writable, b"1" if holds(schedule, "timing", semantics=semantics, lowered=lowered) else b"0")
        finally:
            os._exit(0)
    os.close(writable)
    return child, readable


def generate(schedule: Schedule, *, locations: bool = True, semantics: Semantics | str = Semantics.RENDEZVOUS) -> str:
    """Lower (when compute-only), verify, and render one module with every rank's function (what a
    training script renders at start-up and ``exec``s); an invalid schedule raises ``VerificationError``.

    The schedule is verified as written, so the step indices in the comments
    are the ones ``pipeforge verify`` reports for the same input. ``semantics``:
    ``rendezvous`` (the default, what ``lower`` makes), or ``buffered`` for a
    schedule whose receives were deferred (``passes.defer_recv``): the runtime
    never waits for a send before the end of a step, and a receive waits only
    for its matching send to be posted, which is the buffered reading
    (``docs/runtime.md``).
    """
    lowered = _verified_lowering(schedule, semantics)
    return render_module(lowered.schedule, locations=locations, origins=lowered.origins)


def generate_files(schedule: Schedule, module: str, *, locations: bool = True,
                   semantics: Semantics | str = Semantics.RENDEZVOUS) -> GeneratedFiles:
    """``generate``, as the files ``codegen`` writes: the module ``module`` and one module per rank."""
    lowered = _verified_lowering(schedule, semantics)
    return render_files(lowered.schedule, module, locations=locations, origins=lowered.origins)


def codegen(schedule: Schedule, output: str | os.PathLike, *, locations: bool = True, name: str | None = None,
            force: bool = False, semantics: Semantics | str = Semantics.RENDEZVOUS, jobs: int | None = None) -> Path:
    """Write the module and its rank modules; return the module's path: ``output`` itself when it ends in
    ``.py``, else ``output/<name or schedule name>.py``. The rank modules go in the folder
    ``<name>_ranks_<digest>`` beside it. Refuses (``UsageError``) a name that is not a Python identifier,
    and a target file holding another schedule's module (or anything else) unless ``force``.
    ``semantics``: what the schedule is verified under (``generate``).

    Up to ``BYTECODE_UP_TO`` lowered actions, where Python writes bytecode, each rank module's bytecode is
    written beside it: the modules compile in ``jobs`` worker processes (default: one per core this process
    may use but the one verifying; 0: here, after verifying; ``pipeforge.bytecode``), each from when it is
    rendered, while the schedule is verified; this process then compiles those no worker has started.
    Beyond it only the sources are written (each rank compiles its own module when it first imports it,
    and Python caches it there: ``runtime.rank_modules``), and a large schedule is verified in halves, one
    in a forked child beside the rendering (``Verifying``; with ``jobs=0`` here)."""
    path = module_path(schedule, output, name)
    check_size(schedule)
    if not force:
        check_replaceable(path, schedule)
    lowered = _lowering(schedule, semantics)
    replaceable = None if force else lambda target: check_replaceable(target, schedule)
    bytecode = with_bytecode(lowered.schedule)
    compiling = Compiling(jobs=jobs) if bytecode else None  # each rank compiles in the workers once rendered
    with contextlib.nullcontext() if compiling is None else compiling, \
            Verifying(schedule, lowered, semantics, apart=not bytecode and jobs != 0) as verifying:
        try:
            files = render_files(lowered.schedule, path.stem, locations=locations, origins=lowered.origins,
                                 rendered=None if compiling is None else compiling.add)
        except CodegenError:
            verifying.verdict()  # an invalid schedule is reported as such first
            raise
        if compiling is not None:
            compiling.name(_rank_paths(path.parent / files.rank_folder, files))  # (the folder's digest: known now)
        verifying.verdict()
        codes = None if compiling is None else _rank_codes(compiling)
    write_files(path, files, codes=codes, bytecode=bytecode, replaceable=replaceable)
    return path


# Lowered actions up to which codegen writes the rank modules' bytecode. Compiling them is the largest part
# of codegen's CPU (6 of 17 s for ZBV at P=64, M=1024: 909,440 lowered actions), all ranks in codegen's
# processes, while in a job each rank compiles only its own module, beside the others, when it first imports
# it (0.12-0.18 s there, then cached). Up to here they compile in about 1.5 s of CPU (1F1B at P=32, M=256:
# 48,160, in 0.3-0.5 s). Measured 2026-12-03 (benchmarks/runtime/codegen_scale.py).
BYTECODE_UP_TO = 150_000


def with_bytecode(lowered: Schedule) -> bool:
    """Whether codegen compiles the rank modules of ``lowered`` and writes their bytecode: where Python
    writes bytecode beside a source (not under ``PYTHONDONTWRITEBYTECODE`` or a ``pycache_prefix``, where
    it would not be read), up to ``BYTECODE_UP_TO`` lowered actions."""
    if sys.dont_write_bytecode or sys.pycache_prefix:
        return False
    return lowered.action_count() <= BYTECODE_UP_TO


def _rank_paths(folder: Path, files: GeneratedFiles) -> list[str]:
    """The file name each rank module's code carries: its path once written."""
    return [str((folder / f"rank_{rank}.py").resolve()) for rank in range(len(files.ranks))]


def _rank_codes(compiling: Compiling) -> list[bytes]:
    try:
        return compiling.codes()
    except CompileError as error:
        raise CodegenError(f"generated code for rank {error.index} does not compile: {error.message}") from None


def write_files(path: Path, files: GeneratedFiles, *, codes: list[bytes] | None = None, bytecode: bool = True,
                replaceable=None) -> None:
    """All or nothing: the rank modules into a temporary folder renamed to ``files.rank_folder`` (a name
    no other output has), then the module itself atomically; then older rank folders of this module go.
    At every moment the module on disk names a complete folder. It all happens under the lock every
    pipeforge writer takes on the folder (``files.locked_output``; ``replaceable(path)`` runs under it).
    With ``bytecode``, each rank module is compiled first (``codes``, its marshal'd code, when the caller
    compiled it; none is written if one does not compile), and its bytecode is written to ``__pycache__``
    beside it, so the rank that imports it does not compile it again."""
    directory = path.parent
    folder = directory / files.rank_folder
    if not bytecode:
        codes = None
    elif codes is None:
        with Compiling(list(zip(_rank_paths(folder, files), files.ranks, strict=True))) as compiling:
            codes = _rank_codes(compiling)
    with locked_output(path, make_dirs=True, replaceable=replaceable) as write_module:
        created = not folder.is_dir()
        if created:
            _write_folder(folder, files, codes)
        try:
            write_module(files.main)
        except BaseException:
            if created:  # the module on disk (if any) still names its own folder
                shutil.rmtree(folder, ignore_errors=True)
            raise
        stale = re.compile(re.escape(f"{path.stem}_ranks_") + f"[0-9a-f]{{{DIGEST_LENGTH}}}")
        for other in directory.iterdir():
            if other.name != files.rank_folder and stale.fullmatch(other.name) and other.is_dir():
                shutil.rmtree(other, ignore_errors=True)


def _write_folder(folder: Path, files: GeneratedFiles, codes: list[bytes] | None) -> None:
    """The rank modules (with their bytecode, given ``codes``) in a temporary folder beside ``folder``,
    renamed to it once complete."""
    try:
        staging = Path(tempfile.mkdtemp(prefix=f".{files.rank_folder}.", suffix=".tmp", dir=folder.parent))
    except OSError as error:
        raise UsageError(f"cannot write {str(folder)!r}: {error.strerror or error}") from None
    try:
        for rank, text in enumerate(files.ranks):
            source = staging / f"rank_{rank}.py"
            source.write_bytes(text.encode("utf-8"))
            if codes is not None:
                write_cached(source, codes[rank])
        os.chmod(staging, 0o777 & ~umask())
        os.rename(staging, folder)
    except OSError as error:
        shutil.rmtree(staging, ignore_errors=True)
        raise UsageError(f"cannot write {str(folder)!r}: {error.strerror or error}") from None
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def rank_folder(path: Path) -> Path | None:
    """The folder of rank modules the module at ``path`` names (``RANK_FOLDER``), read without running it."""
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, SyntaxError, ValueError):
        return None
    for node in tree.body:
        if isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] == ["RANK_FOLDER"]:
            value = node.value.value if isinstance(node.value, ast.Constant) else None
            return path.parent / value if isinstance(value, str) else None
    return None


def module_path(schedule: Schedule, output: str | os.PathLike, name: str | None = None) -> Path:
    """Where ``codegen`` writes: ``OUT.py`` as given, or ``OUT/<name>.py``."""
    target = Path(output)
    if target.suffix == ".py":
        if name is not None and name != target.stem:
            raise UsageError(words(Argument("name", value=repr(name)), " and ",
                                   Argument("output", value=repr(str(output))),
                                   " name different modules; give one of them"))
        return target.with_name(f"{import_name(target.stem, Argument('output', value=repr(str(output))))}.py")
    stem = module_name(schedule) if name is None else import_name(name, Argument("name"))
    return target / f"{stem}.py"


def import_name(text: str, what: Argument) -> Ident:
    """A module name the user chose: it must be importable (an identifier, not a keyword)."""
    if not (text.isascii() and text.isidentifier()) or keyword.iskeyword(text):
        raise ArgumentError(what, f"module name {text!r} is not a Python identifier (ASCII letters, digits and '_', "
                                  f"not starting with a digit, not a keyword), so it could not be imported", value=text)
    if text in SHADOWED:
        raise ArgumentError(what, f"module name {text!r} is that of a module the generated code or Python imports; "
                                  f"a file of that name would be imported in its place: name it otherwise",
                            value=text)
    return Ident(text)


def check_replaceable(path: Path, schedule: Schedule) -> None:
    """Refuse to overwrite ``path`` unless it is absent or the module of this same schedule (name and
    parameters): the replacement rule of every output (``files.check_replaceable``)."""
    ours = f"the module of schedule {schedule.name!r}{_params_text(dict(schedule.params))}"
    beside = (Argument("name", value="NAME"), " (or ", Argument("output", value="DIR/NAME.py"), ") to write beside it")
    check_output_replaceable(path, ours=ours, held=_held_module, foreign="is not a module pipeforge wrote",
                             elsewhere=beside)


def _held_module(head: bytes) -> str | None:
    """What the module whose head is ``head`` was generated from, in ``check_replaceable``'s words."""
    found = _schedule_of(parse_module_head(head))
    return None if found is None else f"the module of schedule {found[0]!r}{_params_text(found[1])}"


def generated_schedule(path: Path) -> tuple[str, dict] | None:
    """``(schedule name, PARAMS)`` of a module codegen wrote, read without running it; None otherwise."""
    return _schedule_of(module_head(path))


def _schedule_of(tree: ast.Module | None) -> tuple[str, dict] | None:
    if tree is None:
        return None
    found: dict[str, ast.expr] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            found[node.targets[0].id] = node.value
    info, params = found.get("SCHEDULE"), found.get("PARAMS")
    if not isinstance(info, ast.Call) or params is None:
        return None
    names = [k.value for k in info.keywords if k.arg == "name"]
    try:
        name, values = ast.literal_eval(names[0]) if names else None, ast.literal_eval(params)
    except ValueError:
        return None
    if not isinstance(name, str) or not isinstance(values, dict):
        return None
    return name, values


def _params_text(params: dict) -> str:
    return f" ({', '.join(f'{k}={v}' for k, v in params.items())})" if params else ""


def _report_text(report: object) -> str:
    render = getattr(report, "render", None)
    if callable(render):
        return render()
    return "\n".join(f"  {v}" for v in getattr(report, "violations", ())) or f"  {report}"
