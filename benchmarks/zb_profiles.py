"""The Zero Bubble paper's profiled settings (Qi et al., arXiv 2401.10241, Table 5 and its profile table).

Each row: the model, p stages (= ranks), m microbatches, the profiled T_F, T_B
(the input-gradient backward, pipeforge's I), T_W and T_comm in ms, measured
for that very row, and M_W / M_B (0.366 for 1.5B, 0.432 for the others).
``one_f_one_b`` is the paper's 1F1B bubble rate for the row (pipeforge's
simulation of the library's ``1f1b`` with the row's profile gives every one
of them to four digits, which checks the profile); ``zb_h1`` and ``zb_h2`` the
paper's ZB-H1 and ZB-H2, where known here (None where not).
"""

from __future__ import annotations

from dataclasses import dataclass

from pipeforge.ir import CostModel


@dataclass(frozen=True)
class Row:
    model: str
    p: int
    m: int
    costs: CostModel
    weights: float
    one_f_one_b: float
    zb_h1: float | None
    zb_h2: float | None


def _row(model, p, m, f, b, w, comm, one_f_one_b, zb_h1=None, zb_h2=None) -> Row:
    weights = 0.366 if model == "1.5B" else 0.432
    return Row(model, p, m, CostModel(F=f, I=b, W=w, comm=comm), weights, one_f_one_b, zb_h1, zb_h2)


TABLE_5 = (
    _row("1.5B", 8, 24, 18.522, 18.086, 9.337, 0.601, 0.2431, 0.1585, 0.1083),
    _row("1.5B", 8, 32, 18.513, 18.086, 9.331, 0.626, 0.1985, 0.1242, 0.0837),
    _row("1.5B", 8, 64, 18.546, 18.097, 9.321, 0.762, 0.1240, 0.0674, 0.0444),
    _row("6.2B", 8, 24, 29.718, 29.444, 19.927, 0.527, 0.2347, 0.1323, 0.0698),
    _row("6.2B", 8, 32, 29.802, 29.428, 19.530, 0.577, 0.1898, 0.1045, 0.0559),
    _row("6.2B", 8, 64, 29.935, 29.621, 19.388, 0.535, 0.1091, 0.0554, 0.0294),
    _row("14.6B", 16, 48, 11.347, 11.248, 8.132, 0.377, 0.2552, 0.1397, 0.0672),
    _row("14.6B", 16, 64, 11.307, 11.254, 8.101, 0.379, 0.2082, 0.1088, 0.0516),
    _row("14.6B", 16, 128, 11.325, 11.308, 8.109, 0.378, 0.1251),
    _row("28.3B", 32, 96, 10.419, 10.207, 7.715, 0.408, 0.2646),
    _row("28.3B", 32, 128, 10.408, 10.204, 7.703, 0.408, 0.2168),
    _row("28.3B", 32, 256, 10.402, 10.248, 7.698, 0.460, 0.1352),
)
