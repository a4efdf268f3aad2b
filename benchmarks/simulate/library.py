"""The library's schedules beside their references, in one table: torch 2.13's own order for the
same schedule and the closed form of the schedule's paper, all simulated by pipeforge.sim on the
unit cost model (F = I = W = 1, B = 2, comm = 0; Chimera also at F = B = 1, as its paper draws it).

    python -m benchmarks.simulate.library

Columns: pipeforge's bubble rate, torch's ("invalid" where torch's order fails verification),
the paper's closed form, and the ratios library/torch and library/paper (1.000 = the same).
"""

from __future__ import annotations

import sys

from pipeforge import library
from pipeforge.ir import CostModel
from pipeforge.sim import simulate
from pipeforge.verifier import verify
from tests.library.torch_orders import TORCH_TWINS, torch_schedule

UNIT = CostModel()
EQUAL = CostModel(F=1.0, B=1.0)
PAPER = {  # name -> (closed form of P, M, V, the cost model it holds on)
    "gpipe": (lambda P, M, V: (P - 1) / (M + P - 1), UNIT),
    "1f1b": (lambda P, M, V: (P - 1) / (M + P - 1), UNIT),
    "interleaved-1f1b": (lambda P, M, V: (P - 1) / (V * M + P - 1), UNIT),
    "zb-h1": (lambda P, M, V: (P - 1) / (3 * M + P - 1), UNIT),
    "zb-h2": (lambda P, M, V: 0.0, UNIT),
    "zbv": (lambda P, M, V: 0.0, UNIT),
    "chimera": (lambda P, M, V: (P - 2) / (2 * M + P - 2), EQUAL),
}
SIZES = [(4, 8, 2), (4, 16, 4), (8, 16, 2), (8, 32, 2)]


def torch_rate(name: str, ranks: int, microbatches: int, per_rank: int, costs: CostModel) -> float | str:
    """torch's bubble rate for the same schedule, or why there is none."""
    if name not in TORCH_TWINS:
        return "-"
    torch_class, fixed = TORCH_TWINS[name]
    try:
        schedule = torch_schedule(torch_class, ranks, microbatches, fixed or per_rank)
    except (ValueError, AssertionError):
        return "refused"
    if not verify(schedule, certify=False).valid:
        return "invalid"
    return simulate(schedule, costs).bubble_rate


def cell(value: float | str) -> str:
    return value if isinstance(value, str) else f"{value:.4f}"


def ratio(mine: float, reference: float | str) -> str:
    if isinstance(reference, str):
        return "-"
    if abs(reference) < 1e-12:
        return "1.000" if abs(mine) < 1e-12 else "inf"
    return f"{mine / reference:.3f}"


def row(name: str, ranks: int, microbatches: int, per_rank: int) -> str | None:
    defines = {"P": ranks, "M": microbatches}
    if "V" in dict(library.describe(name)[1]):
        defines["V"] = per_rank
    try:
        schedule = library.load_library_schedule(name, defines)
    except Exception:
        return None
    form, costs = PAPER.get(name, (None, UNIT))
    mine = simulate(schedule, costs).bubble_rate
    theirs = torch_rate(name, ranks, microbatches, per_rank, costs)
    paper = form(ranks, microbatches, per_rank) if form else "-"
    v = str(per_rank) if "V" in defines else "-"
    return (f"{name:<17} {ranks:>2} {microbatches:>3} {v:>2} {mine:>9.4f} {cell(theirs):>9} {cell(paper):>8} "
            f"{ratio(mine, theirs):>10} {ratio(mine, paper):>10}")


def main() -> int:
    print(f"{'schedule':<17} {'P':>2} {'M':>3} {'V':>2} {'pipeforge':>9} {'torch':>9} {'paper':>8} "
          f"{'lib/torch':>10} {'lib/paper':>10}")
    for name in library.names():
        for ranks, microbatches, per_rank in SIZES:
            line = row(name, ranks, microbatches, per_rank)
            if line:
                print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
