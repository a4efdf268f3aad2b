"""Costs in exact integer units, so that no search depends on the unit the costs were given in.

``integer_units(costs)`` -> ``Units``: the costs scaled by one positive factor (``Units.scale``) to
integers of at most ``GRID`` each, so that sums of a whole schedule's durations are exact in a float and
exact ties are ties; the same profile in ms, µs or s gives the same integers. How the ratios are
recovered: ``docs/optimize.md`` (Integer units).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from fractions import Fraction

from pipeforge.ir import CostModel

MAX_DENOMINATOR = 10 ** 6
GRID = 2 ** 26
EXACT = Fraction(1, 10 ** 12)  # a ratio this near a small fraction is that fraction (float rounding is ~1e-16)


@dataclass(frozen=True)
class Units:
    """Integer costs and the factor back: ``real time = integer time * scale``; ``given`` the input's costs."""

    costs: CostModel
    scale: float
    given: CostModel

    def to_real(self, time: float) -> float:
        return time * self.scale


def _values(costs: CostModel) -> list[float]:
    values = [costs.F, costs.I, costs.W, costs.comm]
    if costs.B is not None:
        values.append(costs.B)
    return values + [value for _, _, value in costs.per_stage] + list(costs.links)


def _small_fraction(ratio: float) -> Fraction:
    """The fraction with a denominator of at most ``MAX_DENOMINATOR`` that ``ratio`` is, up to
    rounding (else one with a huge denominator, which sends the caller to the grid)."""
    near = Fraction(ratio).limit_denominator(MAX_DENOMINATOR)
    return near if abs(near - Fraction(ratio)) <= EXACT else Fraction(ratio)


def integer_units(costs: CostModel) -> Units:
    """``costs`` scaled by one factor to exact integers (see the module doc); unchanged if all are 0."""
    largest = max(_values(costs), default=0.0)
    if not largest > 0:
        return Units(costs, 1.0, costs)
    ratios = {value: _small_fraction(value / largest) for value in _values(costs)}
    common = math.lcm(*(ratio.denominator for ratio in ratios.values()))
    if common > GRID:
        ratios = {value: Fraction(round(value / largest * GRID), GRID) for value in ratios}
        common = GRID
    whole = {value: float(ratio * common) for value, ratio in ratios.items()}
    per_stage = tuple((s, k, whole[v]) for s, k, v in costs.per_stage)
    scaled = replace(costs, F=whole[costs.F], I=whole[costs.I], W=whole[costs.W], comm=whole[costs.comm],
                     B=None if costs.B is None else whole[costs.B], per_stage=per_stage,
                     links=tuple(whole[v] for v in costs.links))
    return Units(scaled, largest / common, costs)
