"""print_schedule writes any Schedule as .pipe text that elaborates back to an equal Schedule."""

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeforge.ir import (
    COMPUTE_KINDS, COST_RANGE, IDLE, Action, ActionKind, CostModel, MemorySpec, Placement, Schedule, Step,
    programs_from_tokens,
)
from pipeforge.lang import load_file, load_text
from pipeforge.lang.declarations import reverse_placement
from pipeforge.lang.printer import identifier, placement_text, print_schedule
from pipeforge.resources import library_dir

PROGRAMS = Path(__file__).parent / "programs"
COMPUTE = [ActionKind.F, ActionKind.B, ActionKind.I, ActionKind.W]
COMM = [ActionKind.SEND_F, ActionKind.RECV_F, ActionKind.SEND_B, ActionKind.RECV_B]
STAGE_ONLY = [ActionKind.REDUCE_GRAD, ActionKind.UNSHARD, ActionKind.RESHARD]
names = st.from_regex(r"[A-Za-z][A-Za-z0-9_]{0,8}", fullmatch=True).map(identifier)
costs_values = st.just(0.0) | st.floats(min_value=COST_RANGE[0], max_value=COST_RANGE[1])  # ir.cost_problem's range


@st.composite
def schedules(draw) -> Schedule:
    ranks = draw(st.integers(1, 8))
    stages = draw(st.integers(1, 12))
    microbatches = draw(st.integers(1, 32))
    chains = draw(st.integers(1, 2))
    placements = tuple(draw(placement(stages, ranks)) for _ in range(chains))

    def action(kinds: list[ActionKind]) -> st.SearchStrategy[Action]:
        return st.builds(lambda s, k, m, c: Action(s, k, m if k.has_microbatch else None, c),
                         st.integers(0, stages - 1), st.sampled_from(kinds),
                         st.integers(0, microbatches - 1), st.integers(0, chains - 1))

    step = st.one_of(
        action(COMPUTE).map(lambda a: Step((a,))),
        st.lists(action(COMPUTE), min_size=1, max_size=3).map(lambda a: Step(tuple(a), overlap=True)),
        st.lists(action(COMM), min_size=1, max_size=3).map(lambda a: Step(tuple(a))),
        action(STAGE_ONLY).map(lambda a: Step((a,))),
        st.just(IDLE),
    )
    programs = tuple(tuple(draw(st.lists(step, max_size=12))) for _ in range(ranks))
    params = draw(st.lists(st.tuples(names, st.integers(-50, 10**6)), max_size=3, unique_by=lambda p: p[0]))
    return Schedule(draw(names), ranks, stages, microbatches, placements, programs,
                    costs=draw(st.none() | cost_models(stages)), memory=draw(st.none() | memory_specs()),
                    params=tuple(params))


def placement(stages: int, ranks: int) -> st.SearchStrategy[Placement]:
    return st.one_of(
        st.just(Placement.loop(stages, ranks)), st.just(Placement.v(stages, ranks)),
        st.just(reverse_placement(stages, ranks)),
        st.lists(st.integers(0, ranks - 1), min_size=stages, max_size=stages).map(lambda r: Placement(tuple(r))),
    )


def cost_models(stages: int) -> st.SearchStrategy[CostModel]:
    per_stage = st.tuples(st.integers(0, stages - 1), st.sampled_from("FBIW"), costs_values)
    return st.builds(CostModel, F=costs_values, I=costs_values, W=costs_values, B=st.none() | costs_values,
                     comm=costs_values,
                     per_stage=st.lists(per_stage, max_size=3, unique_by=lambda e: e[:2]).map(tuple))


def memory_specs() -> st.SearchStrategy[MemorySpec]:
    limits = st.none() | st.floats(min_value=1e-6, max_value=1e9, allow_nan=False)
    return st.builds(MemorySpec, limit=limits, weights=st.floats(0.0, 1.0))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(schedules())
def test_print_then_parse_gives_an_equal_schedule(schedule):
    text = print_schedule(schedule)
    assert load_text(text) == schedule
    assert print_schedule(load_text(text)) == text


@pytest.mark.parametrize("path", sorted(library_dir().glob("*.pipe")) + sorted(PROGRAMS.glob("*.pipe")),
                         ids=lambda p: p.stem)
def test_every_shipped_program_round_trips(path):
    schedule = load_file(path)
    assert load_text(print_schedule(schedule)) == schedule


def test_a_per_stage_cost_repeated_in_the_ir_prints_as_the_one_that_counts():
    """The IR's first entry of a (stage, kind) counts; the text holds that one only, as the language refuses
    a per-stage cost given twice (printing both made a file that round-tripped only while it kept the first)."""
    costs = CostModel(per_stage=((1, "F", 2.0), (0, "I", 3.0), (1, "F", 5.0)))
    schedule = Schedule("dup", 2, 2, 1, (Placement.loop(2, 2),), programs_from_tokens([["0F0", "0B0"], ["1F0", "1B0"]]),
                        costs=costs)
    text = print_schedule(schedule)
    assert "F[1] = 2.0  I[0] = 3.0 }" in text and "5.0" not in text
    loaded = load_text(text).costs
    assert loaded.per_stage == ((1, "F", 2.0), (0, "I", 3.0))
    assert all(loaded.duration(kind, s) == costs.duration(kind, s) for kind in COMPUTE_KINDS for s in (0, 1))


def test_canonical_text_of_a_small_schedule():
    schedule = Schedule("demo", 2, 4, 2, (Placement.v(4, 2), Placement((1, 1, 0, 0))),
                        programs_from_tokens([["0F0", "(0F1;3B0@1)", "_"], ["[1SEND_F0 1RECV_B0]", "1REDUCE_GRAD"]]),
                        costs=CostModel(F=1.0, I=2.0, W=0.5, comm=0.1, per_stage=((3, "F", 2.0),)),
                        memory=MemorySpec(limit=4.0, weights=0.25), params=(("P", 2),))
    assert print_schedule(schedule) == (
        "schedule demo(P = 2) {\n"
        "    ranks 2\n"
        "    stages 4 placement v, { 0: [2, 3], 1: [0, 1] }\n"
        "    microbatches 2\n"
        "    costs { F = 1.0  I = 2.0  W = 0.5  comm = 0.1  F[3] = 2.0 }\n"
        "    memory { limit = 4.0  weights = 0.25 }\n"
        "    rank 0 {\n"
        "        0F0 (0F1;3B0@1) _\n"
        "    }\n"
        "    rank 1 {\n"
        "        [1SEND_F0 1RECV_B0] 1REDUCE_GRAD\n"
        "    }\n"
        "}\n"
    )


@pytest.mark.parametrize("name, expected", [("ok_name", "ok_name"), ("rank", "rank_"), ("1f1b", "s_1f1b"),
                                             ("a-b.c", "a_b_c"), ("", "schedule_")])
def test_identifier_makes_names_parseable(name, expected):
    assert identifier(name) == expected


def test_long_programs_wrap():
    schedule = load_file(PROGRAMS / "one_f_one_b.pipe", defines={"P": 2, "M": 64})
    assert max(len(line) for line in print_schedule(schedule).splitlines()) <= 100


@pytest.mark.parametrize("placement, text", [
    (Placement((0, 1, 2, 0, 1, 2)), "loop"), (Placement((0, 1, 2, 2, 1, 0)), "v"),
    (Placement((2, 1, 0, 2, 1, 0)), "reverse"), (Placement((0, 0, 1, 1, 2, 2)), "{ 0: [0, 1], 1: [2, 3], 2: [4, 5] }"),
    (Placement((1, 1, 1, 1, 1, 1)), "{ 1: [0, 1, 2, 3, 4, 5] }"),
])
def test_placement_text(placement, text):
    assert placement_text(placement, 3) == text
