"""Properties of unshard, reduce_grad, merge_bw and defer_recv on drawn valid schedules.

- valid in, valid out (defer_recv: under ``buffered`` semantics, as torch's runtime
  waits on its sends only at the end of a step; a deferred receive can leave a
  rendezvous send waiting, exactly as torch's own pass does);
- they commute with ``lower``: ``p(lower(s))`` and ``lower(p(s))`` hold the same
  compute and stage-only steps in the same order on every rank (they differ at most
  in where communication groups sit; for unshard not even there);
- each does what it says: unshard keeps at most K stages gathered (more only for
  an overlap step's own stages); reduce_grad is idempotent; merge_bw leaves no I
  directly followed by its W; defer_recv puts each receive right before its consumer
  or an earlier receive from the same rank.
"""

from __future__ import annotations


from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import pipeforge.testing as pt
from pipeforge.ir import ActionKind, Schedule, format_grid
from pipeforge.passes import apply_passes, defer_recv, lower, merge_bw, reduce_grad, unshard
from pipeforge.passes.pipeline import PassOptions
from pipeforge.verifier import verify

K = ActionKind
PROPERTY = settings(max_examples=80, deadline=None, suppress_health_check=list(HealthCheck), database=None)
SMALL = dict(max_ranks=4, max_stages_per_rank=2, max_microbatches=4)


def projection(schedule: Schedule) -> tuple[tuple[str, ...], ...]:
    """Each rank's steps other than communication groups and idle slots."""
    return tuple(tuple(str(step) for step in program if not step.is_group and not step.is_idle)
                 for program in schedule.programs)


def assert_valid(schedule: Schedule, semantics: str = "rendezvous") -> None:
    report = verify(schedule, semantics=semantics)
    assert report.valid, format_grid(schedule) + report.render()


@PROPERTY
@given(pt.schedules(**SMALL, idle=True), st.integers(1, 4))
def test_unshard_keeps_schedules_valid_and_commutes_with_lower(schedule, bound):
    sharded = unshard(schedule, bound)
    assert_valid(sharded)
    assert lower(sharded) == unshard(lower(schedule), bound)
    assert_valid(lower(sharded))


@PROPERTY
@given(pt.schedules(**SMALL, overlap=False), st.integers(1, 4))
def test_unshard_gathers_at_most_k_stages(schedule, bound):
    for program in unshard(schedule, bound).programs:
        gathered: set[int] = set()
        for step in program:
            for action in step.actions:
                if action.kind is K.UNSHARD:
                    gathered.add(action.stage)
                elif action.kind is K.RESHARD:
                    gathered.discard(action.stage)
            assert len(gathered) <= bound


@PROPERTY
@given(pt.schedules(**SMALL, idle=True))
def test_reduce_grad_keeps_schedules_valid_and_commutes_with_lower(schedule):
    reduced = reduce_grad(schedule)
    assert_valid(reduced)
    assert reduce_grad(reduced) == reduced
    assert reduce_grad(lower(schedule)) == lower(schedule)  # lower inserts the same REDUCE_GRADs
    assert projection(lower(reduced)) == projection(reduced)
    assert projection(reduce_grad(lower(schedule))) == projection(reduced)


@PROPERTY
@given(pt.schedules(**SMALL, idle=True))
def test_merge_bw_keeps_schedules_valid_and_commutes_with_lower(schedule):
    merged = merge_bw(schedule)
    assert_valid(merged)
    assert_valid(merge_bw(lower(schedule)))
    assert projection(merge_bw(lower(schedule))) == projection(lower(merged))
    for program in merged.programs:
        steps = [step for step in program if not step.is_idle and not step.is_group]
        for first, second in zip(steps, steps[1:]):
            assert not (len(first.actions) == len(second.actions) == 1 and not first.overlap
                        and not second.overlap and first.actions[0].kind is K.I
                        and second.actions[0] == first.actions[0]._replace(kind=K.W)), format_grid(merged)


@PROPERTY
@given(pt.schedules(**SMALL, idle=True))
def test_defer_recv_keeps_schedules_valid_under_buffered_semantics(schedule):
    deferred = defer_recv(schedule)
    assert_valid(deferred, "buffered")
    assert projection(deferred) == projection(lower(schedule))
    assert defer_recv(deferred) == deferred


@PROPERTY
@given(pt.schedules(**SMALL, comms="random"))
def test_defer_recv_on_written_communication(schedule):
    assert_valid(defer_recv(schedule), "buffered")


@PROPERTY
@given(pt.schedules(**SMALL), st.integers(1, 3), st.booleans(), st.booleans(), st.booleans())
def test_every_combination_the_command_line_offers_is_valid(schedule, bound, reduce, merge, defer):
    options = PassOptions(unshard=bound, reduce_grad=reduce, merge_bw=merge, defer_recv=defer)
    out = apply_passes(schedule, options, lower=True)
    assert out.is_lowered or not any(a.is_comm for _, _, a in lower(schedule).actions())
    assert_valid(out, "buffered" if defer else "rendezvous")
