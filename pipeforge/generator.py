"""Codegen: a verified, lowered schedule rendered into one Python module.

``generate(schedule, locations=True, semantics="rendezvous")`` lowers (when compute-only), verifies
(``VerificationError`` if invalid) and renders the module's text; ``codegen(schedule, output, name=None,
force=False)`` writes it (``OUT.py``, or ``DIR/<name>.py``), replacing only the module of the same
schedule unless ``force``. The module (``templates/pipeline.py.j2``) imports only torch and
``pipeforge.runtime``: one function per rank and ``make_pipeline`` (``docs/runtime.md``), each step
commented with its torch token, ``.pipe`` location and verify's step index unless ``locations=False``.
Nothing from the schedule reaches it as code but an ``Ident`` or ``repr()`` of an int, finite float, str,
bool or None (jinja2's ``finalize``; else ``CodegenError``). Compiled, written atomically, byte-identical.
"""

from __future__ import annotations

import ast
import keyword
import math
import os
import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import jinja2

from pipeforge.errors import Argument, ArgumentError, CodegenError, UsageError, VerificationError, words
from pipeforge.files import module_head, refuse_special, write_atomically
from pipeforge.ir import Action, Schedule, Step
from pipeforge.passes.lower import lower_with_origins
from pipeforge.resources import templates_dir
from pipeforge.semantics import RUNTIME_METHODS, Semantics
from pipeforge.verifier import verify

TEMPLATE = "pipeline.py.j2"
RUNTIME_SEMANTICS = (Semantics.RENDEZVOUS, Semantics.BUFFERED)  # what generated code may be verified under


class Ident(str):
    """A validated Python identifier: the only text the templates emit verbatim."""

    def __new__(cls, text: str) -> Ident:
        if not isinstance(text, str) or not text.isidentifier() or keyword.iskeyword(text):
            raise CodegenError(f"{text!r} is not a Python identifier")
        return super().__new__(cls, text)


def finalize(value: object) -> str:
    """What ``{{ ... }}`` may print: identifiers as they are, literals as ``repr()``."""
    if isinstance(value, Ident):
        return str(value)
    if value is None or isinstance(value, (bool, int, str)):
        return repr(value)
    if isinstance(value, float) and math.isfinite(value):
        return repr(value)
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


@dataclass(frozen=True)
class Call:
    """``ctx.<method>(args..., chain=...)``."""

    method: Ident
    args: tuple[int, ...]
    chain: int = 0


@dataclass(frozen=True)
class TokenView:
    """One action's torch token, ``2F0@1``, as the template spells it: ints and an identifier."""

    stage: int
    kind: Ident
    microbatch: int | None
    chain: int


@dataclass(frozen=True)
class StepView:
    form: str  # "call", "overlap" or "post"
    calls: tuple[Call, ...]
    tokens: tuple[TokenView, ...]
    file: str | None  # None: no comment (``locations=False``)
    line: int | None
    col: int | None
    index: int  # the step index verify reports: the written step this one serves


@dataclass(frozen=True)
class RankView:
    rank: int
    steps: tuple[StepView, ...]


METHODS = RUNTIME_METHODS  # kind -> the RankContext method generated code calls (pipeforge.semantics)


def call_of(action: Action) -> Call:
    method = METHODS.get(action.kind)
    if method is None:
        raise CodegenError(f"codegen does not support {action.kind.value} actions ({action})")
    args = (action.stage,) if action.microbatch is None else (action.stage, action.microbatch)
    return Call(Ident(method), _ints(args), _int(action.chain))


def token_of(action: Action) -> TokenView:
    microbatch = None if action.microbatch is None else _int(action.microbatch)
    return TokenView(_int(action.stage), Ident(action.kind.value), microbatch, _int(action.chain))


def step_view(step: Step, index: int, locations: bool) -> StepView:
    calls = tuple(call_of(action) for action in step.actions)
    if step.is_group:
        form = "post"
    elif step.overlap:
        form = "overlap"
    else:
        form = "call"
    span = step.span if locations else None
    where = (Path(span.file).name, _int(span.line), _int(span.col)) if span else (None, None, None)
    return StepView(form, calls, tuple(token_of(a) for a in step.actions), *where, _int(index))


def rank_view(rank: int, program: tuple[Step, ...], origins: tuple[int, ...], locations: bool) -> RankView:
    steps = tuple(step_view(step, origins[i], locations) for i, step in enumerate(program) if not step.is_idle)
    return RankView(_int(rank), steps)


def _int(value: object) -> int:
    if type(value) is not int:
        raise CodegenError(f"expected an integer in the schedule, got {value!r}")
    return value


def _ints(values: tuple) -> tuple[int, ...]:
    return tuple(_int(v) for v in values)


def rank_function(rank: int) -> Ident:
    """The name of rank ``rank``'s function in the module."""
    return Ident(f"rank_{_int(rank)}")


FILTERS = {"rank_function": rank_function}


# -- rendering and writing ----------------------------------------------------------


def module_name(schedule: Schedule) -> Ident:
    """The module's file stem: the schedule name with anything but [A-Za-z0-9_] turned to '_'."""
    stem = re.sub(r"\W", "_", schedule.name, flags=re.ASCII).strip("_") or "schedule"
    if stem[0].isdigit() or keyword.iskeyword(stem):
        stem = f"schedule_{stem}"
    return Ident(stem)


def render_module(schedule: Schedule, *, locations: bool = True,
                  origins: tuple[tuple[int, ...], ...] | None = None) -> str:
    """The module text for a lowered schedule (not verified here: see ``generate``).

    ``origins[r][i]`` is the written step that lowered step ``i`` of rank ``r``
    serves (``lower_with_origins``): the index the comments name. Without it a
    step names its own index (the schedule is taken as written).
    """
    if len(schedule.programs) != schedule.ranks:
        raise CodegenError(f"schedule {schedule.name!r} declares {schedule.ranks} ranks but has "
                           f"{len(schedule.programs)} programs")
    if origins is None:
        origins = tuple(tuple(range(len(program))) for program in schedule.programs)
    context = {
        "name": str(schedule.name),
        "ranks": _int(schedule.ranks),
        "stages": _int(schedule.stages),
        "microbatches": _int(schedule.microbatches),
        "placements": tuple(_ints(p.stage_to_rank) for p in schedule.placements),
        "params": tuple((str(name), _int(value)) for name, value in schedule.params),
        "programs": tuple(rank_view(r, program, origins[r], locations)
                          for r, program in enumerate(schedule.programs)),
    }
    text = environment().get_template(TEMPLATE).render(context)
    try:
        compile(text, f"<pipeforge codegen {schedule.name!r}>", "exec")
    except SyntaxError as error:
        raise CodegenError(f"generated code for {schedule.name!r} does not compile: {error}") from error
    return text


def generate(schedule: Schedule, *, locations: bool = True, semantics: Semantics | str = Semantics.RENDEZVOUS) -> str:
    """Lower (when compute-only), verify, and render; an invalid schedule raises ``VerificationError``.

    The schedule is verified as written, so the step indices in the comments
    are the ones ``pipeforge verify`` reports for the same input. ``semantics``:
    ``rendezvous`` (the default, what ``lower`` makes), or ``buffered`` for a
    schedule whose receives were deferred (``passes.defer_recv``): the runtime
    never waits for a send before the end of a step, and a receive waits only
    for its matching send to be posted, which is the buffered reading
    (``docs/runtime.md``).
    """
    if semantics not in RUNTIME_SEMANTICS:
        raise ArgumentError(Argument("semantics", value=repr(str(semantics))),
                            f"the runtime follows {' or '.join(RUNTIME_SEMANTICS)}")
    check_size(schedule)
    report = verify(schedule, semantics=semantics)
    if not report.valid:
        raise VerificationError(f"schedule {schedule.name!r} does not verify; no code generated:\n"
                                f"{_report_text(report)}", report=report)
    lowered = lower_with_origins(schedule)
    return render_module(lowered.schedule, locations=locations, origins=lowered.origins)


MAX_ACTIONS = 50_000  # as given; a module per action line: P=32 x M=256 1F1B (16,384) takes seconds


def check_size(schedule: Schedule) -> None:
    """Refuse (before any work) a schedule larger than codegen handles in bounded time and memory."""
    count = schedule.action_count()
    if count > MAX_ACTIONS:
        raise CodegenError(f"schedule {schedule.name!r} has {count} actions; codegen writes a module for at most "
                           f"{MAX_ACTIONS} (each becomes a line of Python, and lowering adds its transfers)")


def codegen(schedule: Schedule, output: str | os.PathLike, *, locations: bool = True, name: str | None = None,
            force: bool = False, semantics: Semantics | str = Semantics.RENDEZVOUS) -> Path:
    """Write the module and return its path: ``output`` itself when it ends in ``.py``, else
    ``output/<name or schedule name>.py``. Refuses (``UsageError``) a name that is not a Python
    identifier, and a target file holding another schedule's module (or anything else) unless ``force``.
    ``semantics``: what the schedule is verified under (``generate``)."""
    path = module_path(schedule, output, name)
    check_size(schedule)
    if not force:
        check_replaceable(path, schedule)
    text = generate(schedule, locations=locations, semantics=semantics)
    write_atomically(path, text, make_dirs=True,
                     replaceable=None if force else lambda target: check_replaceable(target, schedule))
    return path


def module_path(schedule: Schedule, output: str | os.PathLike, name: str | None = None) -> Path:
    """Where ``codegen`` writes: ``OUT.py`` as given, or ``OUT/<name>.py``."""
    target = Path(output)
    if target.suffix == ".py":
        if name is not None and name != target.stem:
            raise UsageError(words(Argument("name", value=repr(name)), " and ", Argument("output", value=repr(str(output))),
                                   " name different modules; give one of them"))
        return target.with_name(f"{import_name(target.stem, Argument('output', value=repr(str(output))))}.py")
    stem = module_name(schedule) if name is None else import_name(name, Argument("name"))
    return target / f"{stem}.py"


def import_name(text: str, what: Argument) -> Ident:
    """A module name the user chose: it must be importable (an identifier, not a keyword)."""
    if not text.isidentifier() or keyword.iskeyword(text):
        raise ArgumentError(what, f"module name {text!r} is not a Python identifier (letters, digits and '_', "
                                  f"not starting with a digit, not a keyword), so it could not be imported", value=text)
    return Ident(text)


def check_replaceable(path: Path, schedule: Schedule) -> None:
    """Refuse to overwrite ``path`` unless it is absent or the module of this same schedule."""
    if not os.path.lexists(path):
        return
    refuse_special(path, str(path))  # a folder, FIFO or device: never replaced, --force or not
    held = generated_schedule(path)
    ours = (schedule.name, dict(schedule.params))
    if held == ours:
        return
    what = "is not a module pipeforge wrote" if held is None else \
        f"holds the module of schedule {held[0]!r}{_params_text(held[1])}"
    raise UsageError(words(f"{str(path)!r} exists and {what}; this is schedule {schedule.name!r}"
                           f"{_params_text(ours[1])}. Pass ", Argument("name", value="NAME"), " (or ",
                           Argument("output", value="DIR/NAME.py"), ") to write beside it, or ", Argument("force"),
                           " to replace it"))


def generated_schedule(path: Path) -> tuple[str, dict] | None:
    """``(schedule name, PARAMS)`` of a module codegen wrote, read without running it; None otherwise."""
    tree = module_head(path)
    if tree is None:
        return None
    found: dict[str, object] = {}
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
