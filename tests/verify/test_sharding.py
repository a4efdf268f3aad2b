"""REDUCE_GRAD, UNSHARD and RESHARD: placement, duplicate, order, missing and memory (docs/semantics.md).

Hand-written cases, each checked by ``verify``, by the independent oracle, and
from the same rows as a ``.pipe`` file and as a torch CSV (one verdict); then
the passes' output, valid and mutated, drawn by hypothesis, on which verify and
the oracle must agree.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import pipeforge
import pipeforge.testing as pt
from pipeforge.interop.torch_csv import read_csv_text
from pipeforge.ir import MemorySpec, Placement, Schedule, format_grid, programs_from_tokens
from pipeforge.lang.printer import print_schedule
from pipeforge.passes import reduce_grad, unshard
from pipeforge.verifier import verify
from tests.verify.oracle import oracle
from tests.verify.test_oracle_agreement import kinds_agree  # which kinds the spec fixes

OK0, OK1 = ["0F0", "0B0"], ["1F0", "1B0"]

# (name, rank 0, rank 1, the kinds verify and the oracle report, (rank, step) of the first)
CASES = [
    ("REDUCE_GRAD after the last B", OK0 + ["0REDUCE_GRAD"], OK1 + ["1REDUCE_GRAD"], set(), None),
    ("REDUCE_GRAD of a stage the rank does not hold", OK0 + ["1REDUCE_GRAD"], OK1, {"placement"}, (0, 2)),
    ("UNSHARD of a stage the rank does not hold", ["1UNSHARD"] + OK0, OK1, {"placement", "missing"}, (0, 0)),
    ("REDUCE_GRAD twice", OK0 + ["0REDUCE_GRAD", "0REDUCE_GRAD"], OK1, {"duplicate"}, (0, 3)),
    ("REDUCE_GRAD before the last B", ["0F0", "0REDUCE_GRAD", "0B0"], OK1, {"order"}, (0, 1)),
    ("UNSHARD F B RESHARD", ["0UNSHARD"] + OK0 + ["0RESHARD"], OK1, set(), None),
    ("windows around each compute", ["0UNSHARD", "0F0", "0RESHARD", "0UNSHARD", "0B0", "0RESHARD"], OK1,
     set(), None),
    ("RESHARD before F, UNSHARD after it", ["0RESHARD", "0F0", "0UNSHARD", "0B0", "0RESHARD"], OK1,
     {"order"}, (0, 0)),
    ("compute between a RESHARD and the next UNSHARD",
     ["0UNSHARD", "0F0", "0RESHARD", "0B0", "0UNSHARD", "0RESHARD"], OK1, {"order"}, (0, 3)),
    ("UNSHARD twice", ["0UNSHARD", "0UNSHARD", "0F0", "0B0", "0RESHARD"], OK1, {"order"}, (0, 1)),
    ("compute after the last RESHARD", ["0UNSHARD", "0F0", "0RESHARD", "0B0"], OK1, {"order"}, (0, 3)),
    ("no RESHARD after the last UNSHARD", ["0UNSHARD", "0F0", "0B0"], OK1, {"missing"}, (0, None)),
    ("one stage sharded, the other whole", ["0UNSHARD"] + OK0 + ["0RESHARD"], OK1 + ["1REDUCE_GRAD"], set(), None),
]


def rows_schedule(rows: list[list[str]]) -> Schedule:
    return Schedule("case", 2, 2, 1, (Placement.loop(2, 2),), programs_from_tokens(rows))


def via_pipe(schedule: Schedule) -> Schedule:
    return pipeforge.loads(print_schedule(schedule), filename="case.pipe")


def via_csv(rows: list[list[str]]) -> Schedule:
    return read_csv_text("".join(",".join(row) + "\n" for row in rows), "case.csv")


@pytest.mark.parametrize("name, rank0, rank1, kinds, first", CASES, ids=[c[0] for c in CASES])
def test_case_table(name, rank0, rank1, kinds, first):
    rows = [rank0, rank1]
    schedule = rows_schedule(rows)
    report = verify(schedule)
    assert report.kinds() == kinds, report.render()
    assert oracle(schedule).kinds == kinds
    if first is not None:
        assert (report.violations[0].rank, report.violations[0].step) == first
    for other in (via_pipe(schedule), via_csv(rows)):
        assert verify(other).kinds() == kinds


def test_a_misplaced_reduce_grad_from_csv_is_located():
    report = verify(via_csv([OK0 + ["1REDUCE_GRAD"], OK1]))
    assert [(v.kind, v.location) for v in report.violations] == [("placement", "case.csv:1:9")]


def test_a_misplaced_send_from_csv_gets_the_verdict_of_the_same_rows_in_pipe():
    rows = [["0F0", "0SEND_F0", "1SEND_B0", "0RECV_B0", "0B0"], ["1RECV_F0", "1F0", "1B0"]]
    from_csv, from_pipe = verify(via_csv(rows)), verify(via_pipe(rows_schedule(rows)))
    assert from_csv.kinds() == from_pipe.kinds() and "placement" in from_csv.kinds()


def test_compute_actions_on_two_ranks_still_leave_the_csv_placement_unknown():
    with pytest.raises(pipeforge.errors.SemanticError, match="appears on two ranks"):
        via_csv([OK0 + ["1F0"], OK1])


def test_chains_share_a_stage_for_its_stage_only_actions():
    # Chimera-like: stage 0 on rank 0 in chain 0 and on rank 1 in chain 1; REDUCE_GRAD names no chain
    placements = (Placement((0, 1)), Placement((1, 0)))
    rows = [["0F0", "1F1@1", "1B1@1", "0B0", "0REDUCE_GRAD", "1REDUCE_GRAD"],
            ["0F1@1", "1F0", "1B0", "0B1@1", "0REDUCE_GRAD", "1REDUCE_GRAD"]]
    schedule = Schedule("two", 2, 2, 2, placements, programs_from_tokens(rows))
    assert verify(schedule).valid and oracle(schedule).valid


# ------------------------------------------------------------------ memory of gathered parameters

def sharded_one_rank(unsharded: float, limit: float) -> Schedule:
    rows = [["0UNSHARD", "0F0", "0F1", "0B0", "0B1", "0RESHARD"]]
    memory = MemorySpec(limit=limit, unsharded=unsharded)
    return Schedule("m", 1, 1, 2, (Placement((0,)),), programs_from_tokens(rows), memory=memory)


@pytest.mark.parametrize("unsharded, limit, fits", [(0.0, 2, True), (0.5, 2, False), (0.5, 2.5, True),
                                                    (1.0, 3, True), (1.0, 2.5, False)])
def test_unsharded_parameters_count_against_the_limit(unsharded, limit, fits):
    schedule = sharded_one_rank(unsharded, limit)
    assert verify(schedule).valid == fits == oracle(schedule).valid
    assert pipeforge.loads(print_schedule(schedule)) == schedule  # the printer writes `unsharded`


def test_unsharded_is_a_memory_setting_of_the_language():
    text = ("schedule s { ranks 1 stages 1 placement loop microbatches 1 memory { limit = 1.5 unsharded = 0.75 }\n"
            "rank 0 { 0UNSHARD 0F0 0B0 0RESHARD } }")
    schedule = pipeforge.loads(text)
    assert schedule.memory == MemorySpec(limit=1.5, unsharded=0.75)
    assert verify(schedule).kinds() == {"memory"}


def test_a_negative_unsharded_size_is_refused_with_its_place():
    with pytest.raises(pipeforge.errors.SemanticError) as error:
        pipeforge.loads("schedule s { ranks 1 stages 1 placement loop microbatches 1 memory { unsharded = -1 }\n"
                        "rank 0 { 0F0 0B0 } }", filename="neg.pipe")
    assert "neg.pipe:1:" in error.value.render() and "unsharded" in str(error.value)


# ------------------------------------------------------------------ the passes' output, valid and mutated

SMALL = dict(max_ranks=3, max_stages_per_rank=2, max_microbatches=3)
FAST = settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck), database=None)


@st.composite
def sharded_schedules(draw, mutate: bool, **options):
    schedule = draw(pt.schedules(**SMALL, **options))
    schedule = unshard(schedule, draw(st.integers(1, 3)))
    if draw(st.booleans()):
        schedule = reduce_grad(schedule)
    if mutate:
        for _ in range(draw(st.integers(1, 2))):
            schedule = draw(pt.mutations(schedule, ("swap_steps", "move_action", "drop_action", "duplicate_action")))
    return schedule


def agree(schedule: Schedule, semantics: str = "rendezvous") -> None:
    report = verify(schedule, semantics=semantics)
    expected = oracle(schedule, semantics)
    if report.valid != expected.valid or not kinds_agree(schedule, expected.kinds, report.kinds()):
        pytest.fail("\n".join([f"{semantics}: verify {sorted(report.kinds())}, oracle {sorted(expected.kinds)}",
                               format_grid(schedule), *expected.details, report.render()]))


@FAST
@given(sharded_schedules(mutate=False, idle=True, memory=True))
def test_sharded_schedules_verify_valid(schedule):
    assert verify(schedule).valid and oracle(schedule).valid


@settings(FAST, max_examples=300)
@given(sharded_schedules(mutate=True))
def test_mutated_sharded_compute_only(schedule):
    agree(schedule)


@settings(FAST, max_examples=200)
@given(sharded_schedules(mutate=True, comms="random"))
def test_mutated_sharded_written_communication(schedule):
    agree(schedule, "rendezvous")
    agree(schedule, "buffered")


@settings(FAST, max_examples=100)
@given(sharded_schedules(mutate=False, comms="random"), st.sampled_from([0.25, 0.5, 1.0]))
def test_memory_of_gathered_parameters_agrees(schedule, unsharded):
    peak = oracle_peak(schedule, unsharded)
    for limit, fits in ((peak, True), (peak - 0.125, False)):
        limited = replace(schedule, memory=MemorySpec(limit=limit, weights=0.5, unsharded=unsharded))
        assert verify(limited).valid == fits == oracle(limited).valid, format_grid(limited)


def oracle_peak(schedule: Schedule, unsharded: float) -> float:
    """The peak the memory rule gives (F and UNSHARD add, B and RESHARD release), by bisection on the oracle."""
    low, high = 0.0, 64.0
    while high - low > 1 / 64:
        middle = (low + high) / 2
        fits = oracle(replace(schedule, memory=MemorySpec(limit=middle, weights=0.5, unsharded=unsharded))).valid
        low, high = (low, middle) if fits else (middle, high)
    return high
