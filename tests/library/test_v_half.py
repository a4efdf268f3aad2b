"""V-Half (Qi et al. 2024): valid, about half of 1F1B's activations, and a bubble about half of 1F1B's.

On the unit cost model (F = I = W = 1, comm = 0), as in the paper:

- every rank holds at most 2 min(M, P // 2 + 1) stage-microbatches of activations,
  counted from F to W (P + 2 for even P once M > P/2: (P + 2)/2 microbatches of
  1F1B's twice-as-large stages, where 1F1B holds P);
- for P >= 3 and every M >= P + 2, the bubble rate is d / (6M + d) with
  d = 6 (P - 1) // 2 - 1 slots (about P / 2M; 1F1B's is (P - 1)/(M + P - 1), about P / M);
  on P = 2 it is 1 / (6M + 1), on P = 1 zero.

The orders were checked against the authors' own generator (zbv_greedy.py, run apart
from this repository): equal on every P <= 10, M <= 3P + 2 (185 cases).
"""

from __future__ import annotations

import pytest

import pipeforge
from pipeforge import library
from pipeforge.cli import main
from pipeforge.errors import PipeforgeError
from pipeforge.ir import ActionKind
from pipeforge.sim import simulate
from pipeforge.verifier import verify

F, B, I, W = ActionKind.F, ActionKind.B, ActionKind.I, ActionKind.W


def v_half(ranks: int, microbatches: int):
    return library.load_library_schedule("v-half", {"P": ranks, "M": microbatches})


def held_until_w(schedule, rank: int) -> int:
    held = peak = 0
    for step in schedule.programs[rank]:
        for action in step.actions:
            held += (action.kind is F) - (action.kind in (B, W))
            peak = max(peak, held)
    return peak


@pytest.mark.parametrize("ranks", range(1, 7))
def test_valid_on_every_size(ranks):
    for microbatches in range(1, 2 * ranks + 3):
        schedule = v_half(ranks, microbatches)
        assert (schedule.ranks, schedule.stages, schedule.placement) == (ranks, 2 * ranks, schedule.placement.v(
            2 * ranks, ranks))
        assert verify(schedule).valid, (ranks, microbatches)


@pytest.mark.parametrize("ranks", range(1, 9))
def test_peak_activations_are_about_half_of_1f1b(ranks):
    for microbatches in range(1, 2 * ranks + 3):
        schedule = v_half(ranks, microbatches)
        peaks = [held_until_w(schedule, r) for r in range(ranks)]
        assert max(peaks) == 2 * min(microbatches, ranks // 2 + 1), (ranks, microbatches, peaks)
        # in 1F1B's units (its stages are twice as large): at most (P + 2) / 2 where 1F1B holds min(M, P)
        assert max(peaks) / 2 <= (ranks + 2) / 2


def bubble_form(ranks: int, microbatches: int) -> float:
    if ranks == 1:
        return 0.0
    gap = 1 if ranks == 2 else 6 * ((ranks - 1) // 2) - 1
    return gap / (6 * microbatches + gap)


@pytest.mark.parametrize("ranks", range(1, 9))
def test_bubble_rate_closed_form(ranks):
    for microbatches in range(ranks + 2, 2 * ranks + 3):
        rate = simulate(v_half(ranks, microbatches)).bubble_rate
        assert rate == pytest.approx(bubble_form(ranks, microbatches), abs=1e-9), (ranks, microbatches)


@pytest.mark.parametrize("ranks, microbatches", [(4, 8), (4, 16), (6, 12), (8, 16), (8, 32)])
def test_bubble_is_about_half_of_1f1b(ranks, microbatches):
    ours = simulate(v_half(ranks, microbatches)).bubble_rate
    one_f_one_b = simulate(pipeforge.load("1f1b", defines={"P": ranks, "M": microbatches})).bubble_rate
    assert ours < 0.55 * one_f_one_b
    assert ours < ranks / (2 * microbatches)


def test_the_library_lists_it_and_new_writes_it_explicitly(tmp_path, capsys):
    assert "v-half" in library.names()
    description, params = library.describe("v-half")
    assert "V-Half" in description and params == [("P", 4), ("M", 8)]
    target = tmp_path / "vh.pipe"
    assert main(["new", "v-half", "-D", "P=3", "-D", "M=5", "-o", str(target)]) == 0
    written = pipeforge.load(str(target))
    assert written.programs == v_half(3, 5).programs and written.params == ()
    assert target.read_text().startswith(f"# {description}\n")


@pytest.mark.parametrize("defines, says", [({"Q": 1}, "no parameter 'Q'"), ({"P": 0}, "at least 1"),
                                           ({"P": 64, "M": 128}, "at most")])
def test_refused_parameters(defines, says):
    with pytest.raises(PipeforgeError, match=says):
        library.load_library_schedule("v-half", defines)
