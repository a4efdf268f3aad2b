"""Codegen: a verified, lowered schedule rendered into one Python module.

The module (``templates/pipeline.py.j2``) imports only torch and
``pipeforge.runtime``; it holds one plain function per rank whose body is that
rank's steps in order, each with its ``.pipe`` location as a comment (left out
with ``locations=False`` so golden files stay stable), and ``make_pipeline``.

Nothing from the schedule reaches the module as code except what the jinja2
``finalize`` hook lets through: an ``Ident`` (checked with ``str.isidentifier``
and ``keyword.iskeyword``) verbatim, and ``repr()`` of an int, a finite float,
a str, a bool or None. Anything else raises ``CodegenError``. Every module is
compiled before it is written, written atomically, and the same schedule gives
byte-identical text.
"""

from __future__ import annotations

import keyword
import math
import os
import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import jinja2

from pipeforge.errors import CodegenError, VerificationError
from pipeforge.files import write_atomically
from pipeforge.ir import Action, ActionKind, Schedule, Step
from pipeforge.resources import templates_dir

TEMPLATE = "pipeline.py.j2"


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
class StepView:
    form: str  # "call", "overlap" or "post"
    calls: tuple[Call, ...]
    file: str | None
    line: int | None


@dataclass(frozen=True)
class RankView:
    rank: int
    steps: tuple[StepView, ...]


METHODS = {
    ActionKind.F: "forward", ActionKind.B: "backward", ActionKind.I: "backward_input",
    ActionKind.W: "backward_weight", ActionKind.SEND_F: "send_f", ActionKind.RECV_F: "recv_f",
    ActionKind.SEND_B: "send_b", ActionKind.RECV_B: "recv_b", ActionKind.REDUCE_GRAD: "reduce_grad",
    ActionKind.UNSHARD: "unshard", ActionKind.RESHARD: "reshard",
}


def call_of(action: Action) -> Call:
    method = METHODS.get(action.kind)
    if method is None:
        raise CodegenError(f"codegen does not support {action.kind.value} actions ({action})")
    args = (action.stage,) if action.microbatch is None else (action.stage, action.microbatch)
    return Call(Ident(method), _ints(args), _int(action.chain))


def step_view(step: Step, locations: bool) -> StepView:
    calls = tuple(call_of(action) for action in step.actions)
    if step.is_group:
        form = "post"
    elif step.overlap:
        form = "overlap"
    else:
        form = "call"
    span = step.span if locations else None
    return StepView(form, calls, Path(span.file).name if span else None, _int(span.line) if span else None)


def rank_view(rank: int, program: tuple[Step, ...], locations: bool) -> RankView:
    steps = tuple(step_view(step, locations) for step in program if not step.is_idle)
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


def render_module(schedule: Schedule, *, locations: bool = True) -> str:
    """The module text for a lowered schedule (not verified here: see ``generate``)."""
    if len(schedule.programs) != schedule.ranks:
        raise CodegenError(f"schedule {schedule.name!r} declares {schedule.ranks} ranks but has "
                           f"{len(schedule.programs)} programs")
    context = {
        "name": str(schedule.name),
        "ranks": _int(schedule.ranks),
        "stages": _int(schedule.stages),
        "microbatches": _int(schedule.microbatches),
        "placements": tuple(_ints(p.stage_to_rank) for p in schedule.placements),
        "params": tuple((str(name), _int(value)) for name, value in schedule.params),
        "programs": tuple(rank_view(r, program, locations) for r, program in enumerate(schedule.programs)),
    }
    text = environment().get_template(TEMPLATE).render(context)
    try:
        compile(text, f"<pipeforge codegen {schedule.name!r}>", "exec")
    except SyntaxError as error:
        raise CodegenError(f"generated code for {schedule.name!r} does not compile: {error}") from error
    return text


def generate(schedule: Schedule, *, locations: bool = True) -> str:
    """Lower (when compute-only), verify, and render; an invalid schedule raises ``VerificationError``."""
    from pipeforge.passes.lower import lower
    from pipeforge.verify import verify

    lowered = lower(schedule) if not schedule.is_lowered else schedule
    report = verify(lowered)
    if not report.valid:
        raise VerificationError(f"schedule {schedule.name!r} does not verify; no code generated:\n"
                                f"{_report_text(report)}", report=report)
    return render_module(lowered, locations=locations)


def codegen(schedule: Schedule, out_dir: str | os.PathLike, *, locations: bool = True) -> Path:
    """Write ``OUT_DIR/<schedule name>.py``; returns its path."""
    text = generate(schedule, locations=locations)
    path = Path(out_dir) / f"{module_name(schedule)}.py"
    write_atomically(path, text, make_dirs=True)
    return path



def _report_text(report: object) -> str:
    render = getattr(report, "render", None)
    if callable(render):
        return render()
    return "\n".join(f"  {v}" for v in getattr(report, "violations", ())) or f"  {report}"


from pipeforge._callable import make_callable  # noqa: E402

make_callable(__name__)  # pipeforge.codegen(...) calls codegen()
