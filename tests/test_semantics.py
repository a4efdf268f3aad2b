"""The rules of pipeforge.semantics: every kind known to every table, and the tables agree with each other.

A new ActionKind that some subsystem does not know fails here (not silently
later): each test iterates every kind through one table or dispatch.
"""

from __future__ import annotations

import io
import re
import tokenize
from pathlib import Path

import pytest

from pipeforge import semantics
from pipeforge.ir import (
    COMM_KINDS, COMPUTE_KINDS, STAGE_ONLY_KINDS, Action, ActionKind, CostModel, MemorySpec, Placement, Schedule, Step,
    as_action, parse_action,
)
from pipeforge.semantics import needs, output, partner, peer_stage

ALL = tuple(ActionKind)


def example(kind: ActionKind, stage: int = 1, chain: int = 0) -> Action:
    return Action(stage, kind, None if kind in STAGE_ONLY_KINDS else 2, chain)


@pytest.mark.parametrize("kind", ALL)
def test_every_kind_has_exactly_one_role(kind):
    roles = [kind in COMPUTE_KINDS, kind in COMM_KINDS, kind in STAGE_ONLY_KINDS]
    assert roles.count(True) == 1
    assert semantics.role(kind) in ("compute", "comm", "stage")


@pytest.mark.parametrize("table", ["ROLES", "NEEDS", "OUTPUTS", "MEMORY"])
def test_every_kind_is_in_every_rule_table(table):
    assert set(getattr(semantics, table)) == set(ALL)


@pytest.mark.parametrize("kind", sorted(COMM_KINDS))
def test_communication_peers_meet_each_other(kind):
    action = example(kind)
    other = as_action(partner(action))
    assert as_action(partner(other)) == action
    assert peer_stage(action) == other.stage and peer_stage(other) == action.stage
    assert (kind in semantics.SENDS) != (other.kind in semantics.SENDS)


@pytest.mark.parametrize("kind", sorted(COMPUTE_KINDS))
@pytest.mark.parametrize("stage", [0, 1, 2])
def test_what_carries_an_input_is_what_its_producer_sends(kind, stage):
    """needs() of a consumer and output() of its producer name the same send and receive."""
    action = example(kind, stage)
    for producers, send, recv in needs(action, 3):
        for producer in producers:
            goes = output(producer, 3)
            if send is None:
                assert producer[0] == stage  # same stage, so always on the same rank
            else:
                assert goes is not None and goes.stage == stage
                assert (goes.send, goes.recv) == (send, recv)


def test_the_documented_dependencies():
    text = {str(a): [[str(as_action(p)) for p in producers] for producers, _, _ in needs(a, 4)]
            for a in map(parse_action, ["0F1", "2F1", "1B1", "3B1", "1I1", "1W1", "1SEND_F1", "1SEND_B1", "1RECV_F1"])}
    assert text == {"0F1": [], "2F1": [["1F1"]], "1B1": [["1F1"], ["2B1", "2I1"]], "3B1": [["3F1"]],
                    "1I1": [["1F1"], ["2B1", "2I1"]], "1W1": [["1I1"]], "1SEND_F1": [["1F1"]],
                    "1SEND_B1": [["1B1", "1I1"]], "1RECV_F1": []}


@pytest.mark.parametrize("weights", [0.0, 0.3, 1.0])
def test_memory_effects(weights):
    assert semantics.memory_effect(ActionKind.F, weights) == (1.0, 0.0)
    assert semantics.memory_effect(ActionKind.B, weights) == (0.0, 1.0)
    assert semantics.memory_effect(ActionKind.I, weights) == (0.0, 1.0 - weights)
    assert semantics.memory_effect(ActionKind.W, weights) == (0.0, weights)
    for kind in COMM_KINDS | STAGE_ONLY_KINDS:
        assert semantics.memory_delta(kind, weights) == 0.0


def test_split_and_completeness_agree():
    b = Action(1, ActionKind.B, 0)
    assert semantics.split(b) == (Action(1, ActionKind.I, 0), Action(1, ActionKind.W, 0))
    assert tuple(sorted((ActionKind.F, *(a.kind for a in semantics.split(b))))) in semantics.COMPLETE
    for kind, excluded in semantics.EXCLUDES.items():
        assert all(kind in semantics.EXCLUDES[other] for other in excluded)


def test_sends_and_receives_split_the_communication_kinds():
    assert semantics.SENDS | semantics.RECEIVES == COMM_KINDS and not semantics.SENDS & semantics.RECEIVES
    assert {semantics.PARTNER[kind] for kind in semantics.SENDS} == semantics.RECEIVES


def test_the_memory_saving_kinds_are_local_and_each_excludes_the_other_way():
    assert semantics.SAVING <= semantics.LOCAL_KINDS
    assert all(semantics.EXCLUDES[kind] and semantics.EXCLUDES[kind] <= semantics.SAVING for kind in semantics.SAVING)


# --- every subsystem knows every kind ------------------------------------------------------


def one_of_each() -> Schedule:
    """Two stages on two ranks, one of every kind on rank 0's stage 0 (most of it invalid, none unknown)."""
    programs = ([Step((example(kind, 0),)) for kind in ALL if kind not in COMM_KINDS]
                + [Step((Action(0, kind, 0),)) for kind in sorted(COMM_KINDS)], [Step((Action(1, ActionKind.F, 0),))])
    return Schedule("every kind", 2, 2, 3, (Placement((0, 1)),), tuple(map(tuple, programs)),
                    memory=MemorySpec(limit=1.0))


def test_verify_knows_every_kind():
    from pipeforge.verifier import verify

    report = verify(one_of_each(), certify=False)
    assert not report.valid and {v.kind for v in report.violations} <= {
        "placement", "duplicate", "missing", "order", "mismatch", "deadlock", "memory"}


def test_the_work_graph_and_simulation_know_every_compute_kind():
    from pipeforge.sim.workgraph import compile_actions, Shape

    actions = [example(kind, 0) for kind in COMPUTE_KINDS]
    graph = compile_actions(Shape(1, 1, 3, (Placement((0,)),)), actions, CostModel(), MemorySpec())
    assert sorted(graph.actions) == sorted(actions) and all(d > 0 for d in graph.duration)


def test_lower_knows_every_kind():
    from pipeforge.passes.lower import lower

    written = [Step((example(kind, 0),)) for kind in sorted(STAGE_ONLY_KINDS)]
    compute = [Step((Action(0, ActionKind.F, 0),)), Step((Action(0, ActionKind.B, 0),))]
    schedule = Schedule("s", 2, 2, 1, (Placement((0, 1)),),
                        (tuple(compute + written), (Step((Action(1, ActionKind.F, 0),)), Step((Action(1, ActionKind.B, 0),)))))
    kinds = {a.kind for _, _, a in lower(schedule).actions()}
    assert STAGE_ONLY_KINDS <= kinds and {ActionKind.SEND_F, ActionKind.RECV_B} <= kinds


def test_codegen_and_the_runtime_know_every_kind_they_run():
    from pipeforge.generator import METHODS

    from pipeforge.runtime.context import RankContext

    assert set(METHODS) == set(ALL)
    for kind, method in METHODS.items():
        assert callable(getattr(RankContext, method, None)), kind


# --- Action is the fast key ------------------------------------------------------------------


def test_action_is_a_tuple_key_with_a_c_level_hash():
    action = Action(2, ActionKind.F, 0, 1)
    assert action == (2, ActionKind.F, 0, 1) == (2, "F", 0, 1)
    assert hash(action) == hash((2, "F", 0, 1))
    assert ActionKind.__hash__ is str.__hash__
    assert {action: 1}[(2, ActionKind.F, 0, 1)] == 1


@pytest.mark.parametrize("text", ["2F0", "0SEND_F1", "1REDUCE_GRAD", "2F0@1", "3W12", "0RECV_B3@1"])
def test_action_text_round_trips(text):
    action = parse_action(text)
    assert str(action) == text and repr(action) == f"Action({text})"
    assert as_action(tuple(action)) == action and type(as_action(tuple(action))) is Action


def test_actions_order_by_stage_kind_microbatch_chain():
    actions = [parse_action(t) for t in ["1F0", "0W1", "0B1", "0F2@1", "0F2"]]
    assert [str(a) for a in sorted(actions)] == ["0B1", "0F2", "0F2@1", "0W1", "1F0"]


@pytest.mark.parametrize("limit, waits", [
    (None, [None] * 6), (4.0, [None] * 6),
    (2.0, [None, None, None, 2, None, 4]),  # two held: every earlier offload's release is needed
    (3.0, [None, None, None, None, None, 2]),  # room for one transfer in flight: only the first must end
    (1.0, [None, None, None, 2, None, 4]),  # over the limit (verify refuses it): waits for the last
])
def test_an_addition_waits_for_an_offload_only_when_the_limit_needs_it(limit, waits):
    """F F OFFLOAD F OFFLOAD F, one M_B each (``semantics.offload_waits``)."""
    from pipeforge.semantics import offload_waits

    steps = [(1.0, 0.0, False), (1.0, 0.0, False), (0.0, 1.0, True), (1.0, 0.0, False), (0.0, 1.0, True),
             (1.0, 0.0, False)]
    assert offload_waits(steps, limit) == waits


def test_the_kind_sets_the_optimizer_reads():
    assert semantics.SPLIT_WORK == (ActionKind.F, ActionKind.I, ActionKind.W)
    assert semantics.SPLIT_WORK_TEXTS == ("F", "I", "W")
    assert semantics.PLAIN_KINDS == {ActionKind.F, ActionKind.B, ActionKind.I, ActionKind.W}
    assert semantics.INPUT_GRADIENT_KINDS == {ActionKind.B, ActionKind.I}


# a tuple or set of two or more kinds spelled out: letters, their texts, or ActionKind members
KIND_GROUP = re.compile(r"[({]\s*((ActionKind\.)?[FBIWR]|\"[FBIWR]\")(\s*,\s*((ActionKind\.)?[FBIWR]|\"[FBIWR]\"))+\s*[)}]")


def _kind_groups(text: str) -> list[str]:
    """The groups of kinds ``text`` spells out in code (comments and longer strings, docstrings among them,
    left out)."""
    found = [token.string for token in tokenize.generate_tokens(io.StringIO(text).readline)
             if token.type != tokenize.COMMENT and not (token.type == tokenize.STRING and len(token.string) > 3)]
    code = " ".join(found).replace("( ", "(").replace(" )", ")").replace("{ ", "{").replace(" }", "}")
    return [m.group(0) for m in KIND_GROUP.finditer(code.replace(" ,", ",").replace(" . ", "."))]


def test_the_optimizer_spells_no_group_of_kinds_of_its_own():
    """Which kinds the split work holds, a plain schedule holds, make an input's gradient, ...: semantics says
    (STYLE.md 13); the optimizer reads its sets. A group that is no such fact (a scheduler's own preference,
    I before F) is the optimizer's; names of single kinds, ``F, I, W = ...``, are not bracketed groups."""
    owned = [frozenset(kind.value for kind in group) for group in (
        semantics.SPLIT_WORK, semantics.PLAIN_KINDS, semantics.INPUT_GRADIENT_KINDS, semantics.SPLIT[ActionKind.B],
        semantics.GRADIENT_KINDS, semantics.SAVING)]
    root = Path(__file__).resolve().parents[1] / "pipeforge" / "optimizer"
    spelled = {path.name: groups for path in sorted(root.glob("*.py"))
               if (groups := [g for g in _kind_groups(path.read_text(encoding="utf-8")) if _letters(g) in owned])}
    assert spelled == {}


def _letters(group: str) -> frozenset[str]:
    return frozenset(re.findall(r"(?<![A-Za-z_])[FBIWR](?![A-Za-z_])", group.replace("ActionKind.", "")))


def test_the_kind_scan_sees_a_spelled_group():
    assert _kind_groups('for k in (F, I, W):\n    pass\nx = ("F", "I", "W")\ny = {ActionKind.B, ActionKind.I}\n') == [
        "(F, I, W)", '("F", "I", "W")', "{ActionKind.B, ActionKind.I}"]
    assert _kind_groups('"""(F, I, W)"""\n# (B, I)\nF, I = 1, 2\n') == []


@pytest.mark.parametrize(("over", "within"), [(0.0, True), (0.5e-9, True), (2e-9, False)])
def test_verify_and_simulate_read_a_limit_by_one_tolerance(over, within):
    """``semantics.within_limit``: what a rank may hold past a limit and still be within it, one tolerance
    for verify's ``memory`` check, simulate's ``within_memory_limit`` and the optimizers' tests."""
    from dataclasses import replace

    from pipeforge import simulate, verify
    from pipeforge.library import load_library_schedule

    schedule = load_library_schedule("zb-h1", {"P": 2, "M": 4})
    peak = max(simulate(schedule).peak_memory)
    limited = replace(schedule, memory=replace(schedule.memory or MemorySpec(), limit=peak - over))
    assert semantics.within_limit(peak, peak - over) is within
    assert simulate(limited).within_memory_limit is within and verify(limited).valid is within
