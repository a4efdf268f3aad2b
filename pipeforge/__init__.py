"""pipeforge: formally checked pipeline-parallel training schedules.

The public face. Heavy parts (z3, torch) are imported only when used.

    import pipeforge
    sched = pipeforge.load("1f1b.pipe", defines={"P": 4, "M": 8})
    report = pipeforge.verify(sched)          # pipeforge.verify.Report
    timeline = pipeforge.simulate(sched)      # pipeforge.sim.Timeline
"""

from __future__ import annotations

from pipeforge.errors import PipeforgeError, PipeSyntaxError, SemanticError, UsageError, VerificationError
from pipeforge.ir import Action, ActionKind, CostModel, MemorySpec, Placement, Schedule, Step
from pipeforge.inputs import load

__version__ = "0.1.0"

__all__ = [
    "Action", "ActionKind", "CostModel", "MemorySpec", "Placement", "Schedule", "Step",
    "PipeforgeError", "PipeSyntaxError", "SemanticError", "UsageError", "VerificationError",
    "load", "loads", "verify", "simulate", "optimize", "codegen", "lower", "split",
]


def loads(text: str, *, defines: dict[str, int] | None = None, schedule: str | None = None,
          filename: str = "<string>") -> Schedule:
    """Elaborate ``.pipe`` source text into a Schedule."""
    from pipeforge.lang import load_text

    return load_text(text, defines=defines, schedule=schedule, filename=filename)


def lower(schedule: Schedule) -> Schedule:
    """Insert send/receive groups and REDUCE_GRAD (a compute-only schedule in, a lowered one out)."""
    from pipeforge.passes.lower import lower as lower_pass

    return lower_pass(schedule)


def verify(schedule: Schedule, **options):
    """Check a schedule with the z3 model; returns a report with ``.valid`` and ``.violations``."""
    from pipeforge.verifier import verify as verify_schedule

    return verify_schedule(schedule, **options)


def simulate(schedule: Schedule, costs: CostModel | None = None, **options):
    """Run the schedule on the cost model; returns a Timeline."""
    from pipeforge.sim import simulate as simulate_schedule

    return simulate_schedule(schedule, costs, **options)


def optimize(schedule: Schedule, **options):
    from pipeforge.optimizer import optimize as optimize_schedule

    return optimize_schedule(schedule, **options)


def codegen(schedule: Schedule, out_dir: str, **options):
    from pipeforge.generator import codegen as codegen_schedule

    return codegen_schedule(schedule, out_dir, **options)


def split(model, stages, *, owned=None, layers=None, costs=None, **options):
    """Cut ``model`` into stage modules (``.modules``) with its ties (``.tied_parameters``) for
    ``make_pipeline``; see ``pipeforge.models.split``. Imports torch."""
    from pipeforge.models.split import split as split_model

    return split_model(model, stages, owned=owned, layers=layers, costs=costs, **options)
