"""Valid programs elaborate to the expected IR: a table of small programs and their rank programs."""

import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeforge.commands import wording
from pipeforge.errors import Argument, ArgumentError, SemanticError, Span, UsageError
from pipeforge.ir import Action, ActionKind, CostModel, MemorySpec, Placement, Step, programs_from_tokens
from pipeforge.lang import default_offsets, load_file, load_text, parameters, schedule_names

PROGRAMS = Path(__file__).parent / "programs"
HEAD = "schedule s(P = 2, M = 3) {\n ranks P\n stages P placement loop\n microbatches M\n"


def tokens(line: str) -> list[str]:
    """Step tokens of one line; a group '[a b]' is one token."""
    return re.findall(r"\[[^\]]*\]|\S+", line)


def one_f_one_b_by_hand(ranks: int, microbatches: int) -> list[list[str]]:
    """1F1B written from its description: warm up with forwards, alternate, drain the backwards."""
    result = []
    for rank in range(ranks):
        forwards = [f"{rank}F{m}" for m in range(microbatches)]
        backwards = [f"{rank}B{m}" for m in range(microbatches)]
        warmup = min(microbatches, ranks - 1 - rank)
        order = forwards[:warmup]
        pending_f, pending_b = forwards[warmup:], list(backwards)
        while pending_f:
            order += [pending_f.pop(0), pending_b.pop(0)]
        result.append(order + pending_b)
    return result


@pytest.mark.parametrize("ranks, microbatches", [(1, 1), (2, 3), (4, 4), (4, 8), (8, 16), (3, 7)])
def test_design_1f1b_matches_the_hand_built_order(ranks, microbatches):
    schedule = load_file(PROGRAMS / "one_f_one_b.pipe", defines={"P": ranks, "M": microbatches})
    assert schedule.programs == programs_from_tokens(one_f_one_b_by_hand(ranks, microbatches))
    assert (schedule.ranks, schedule.stages, schedule.microbatches) == (ranks, ranks, microbatches)
    assert schedule.placements == (Placement.loop(ranks, ranks),)
    assert schedule.params == (("P", ranks), ("M", microbatches))


CASES = {
    "tokens": (HEAD + " rank 0 { 0F0 (0F1;1B0) [0SEND_F0 0RECV_B0] _ 0REDUCE_GRAD 0W1 }\n}",
               "0F0 (0F1;1B0) [0SEND_F0 0RECV_B0] _ 0REDUCE_GRAD 0W1\n"),
    "loops and let": (HEAD + " rank r { let k = r + 1  for m in 0 .. k { F(r, m) } }\n}", "0F0\n1F0 1F1"),
    "range with a step": (HEAD + " rank 0 { for m in M - 1 .. -1 by -1 { F(0, m) } }\n}", "0F2 0F1 0F0\n"),
    "if elif else": (HEAD + " rank r { for m in 0 .. M { if m == 0 { F(r, m) } elif m % 2 == 1 { B(r, m) }"
                     " else { idle } } }\n}", "0F0 0B1 _\n1F0 1B1 _"),
    "min max and or not": (HEAD + " rank r { if not (r == 0) and max(r, 1) == min(1, 5) or 0 > 1 { F(r, 0) } }\n}",
                           "\n1F0"),
    "overlap block": (HEAD + " rank 1 { overlap { F(1, 0) B(1, 2) } overlap { F(1) } }\n}", "\n(1F0;1B2) (1F1)"),
    "group block": (HEAD + " rank 0 { group { SEND_F(0, 0) RECV_B(0, 0) } SEND_B(0, 1) REDUCE_GRAD(0) }\n}",
                    "[0SEND_F0 0RECV_B0] 0SEND_B1 0REDUCE_GRAD\n"),
    "implicit microbatches": (HEAD + " rank 0 { F(0) F(0, 2) F(0) I(0) I(0) W(0) B(0) W(0) }\n}",
                              "0F0 0F2 0F1 0I0 0I1 0W0 0B2 0W1\n"),
    "implicit W is the oldest with I done": (HEAD + " rank 0 { I(0, 2) I(0, 0) W(0) W(0) }\n}",
                                             "0I2 0I0 0W2 0W0\n"),
    "single rank block by expression": (HEAD + " rank P - 1 { F(1, 0) }\n}", "\n1F0"),
    "rank blocks inside a loop": (HEAD + " for q in 0 .. P { rank q { F(q, q) } }\n}", "0F0\n1F1"),
    "names shadow per block": (HEAD + " let x = 1\n rank 0 { let x = 0  F(0, x) }\n rank 1 { F(1, x) }\n}",
                               "0F0\n1F1"),
    "comments and blank lines": (HEAD + " # a comment\n\n rank 0 { F(0, 0) # trailing\n }\n}", "0F0\n"),
}


@pytest.mark.parametrize("name", list(CASES))
def test_program_elaborates_to_expected_steps(name):
    text, expected = CASES[name]
    schedule = load_text(text)
    expected_rows = [tokens(line) for line in expected.split("\n")]
    expected_rows += [[]] * (schedule.ranks - len(expected_rows))
    assert schedule.programs == programs_from_tokens(expected_rows)


def test_chains_from_placements_and_actions():
    text = """schedule bi(P = 2, M = 2) {
        ranks P
        stages P placement loop, reverse
        microbatches M
        rank r { F(r, 0)  F@1(P - 1 - r, 0)  chain 1 { F(P - 1 - r) B(P - 1 - r, 0) }  1B0@1 }
    }"""
    schedule = load_text(text)
    assert schedule.placements == (Placement((0, 1)), Placement((1, 0)))
    assert schedule.programs[0] == programs_from_tokens([["0F0", "1F0@1", "1F1@1", "1B0@1", "1B0@1"]])[0]
    assert schedule.programs[1][1].actions == (Action(0, ActionKind.F, 0, 1),)


@pytest.mark.parametrize("placement, expected", [
    ("loop", (0, 1, 0, 1)), ("v", (0, 1, 1, 0)), ("reverse", (1, 0, 1, 0)),
    ("{ 0: [0, 3], 1: [1, 2] }", (0, 1, 1, 0)), ("{ 1: [P * 2 - 1], 0: [0, 1, 2], }", (0, 0, 0, 1)),
    ("{ for q in 0 .. P: [q, 2 * P - 1 - q] }", (0, 1, 1, 0)), ("{ 1: [0], for q in 0 .. 1: [1, 2, 3] }", (1, 0, 0, 0)),
])
def test_placements(placement, expected):
    schedule = load_text(f"schedule s(P = 2) {{ ranks P stages 2 * P placement {placement} microbatches 1 }}")
    assert schedule.placement == Placement(expected)
    assert schedule.programs == ((), ())


def test_costs_and_memory():
    text = HEAD + " costs { F = 1  I = 1.5 W = 0.5 comm = 0.25 F[1] = 2 * 1.5 B[0] = 4.0 }\n" \
                  " memory { limit = 2 * P  weights = 0.3 }\n}"
    schedule = load_text(text)
    assert schedule.costs == CostModel(F=1.0, I=1.5, W=0.5, comm=0.25, per_stage=((1, "F", 3.0), (0, "B", 4.0)))
    assert schedule.costs.duration(ActionKind.B, 1) == 2.0
    assert schedule.memory == MemorySpec(limit=4.0, weights=0.3)


def test_b_cost_given_explicitly():
    schedule = load_text(HEAD + " costs { B = 3.0 }\n}")
    assert schedule.costs == CostModel(B=3.0)


def test_spans_point_at_the_call_or_token():
    schedule = load_text(HEAD + " rank 0 {\n  F(0, 0)  0B0\n  overlap { F(0, 1) B(0, 1) }\n }\n}", filename="x.pipe")
    spans = [step.span for step in schedule.programs[0]]
    assert [(s.file, s.line, s.col, s.end_line, s.end_col) for s in spans] == [
        ("x.pipe", 6, 3, 6, 10), ("x.pipe", 6, 12, 6, 15), ("x.pipe", 7, 3, 7, 30)]


def test_defines_override_defaults_and_unknown_names_are_refused():
    assert load_text(HEAD + "}", defines={"M": 5}).microbatches == 5
    with pytest.raises(ArgumentError, match=r"^defines\['Q'\]: .* no parameter 'Q' \(its parameters: P, M\)"):
        load_text(HEAD + "}", defines={"Q": 1})
    with pytest.raises(ArgumentError, match="must be an integer") as caught:
        load_text(HEAD + "}", defines={"M": 2.5})
    assert (caught.value.argument, caught.value.value) == (Argument("defines", "M"), 2.5)
    assert wording.message(caught.value) == "-D M: the value must be an integer, got 2.5"


def test_several_schedules_need_a_name():
    text = "schedule a(X = 1) { ranks 1 stages 1 placement loop microbatches 1 }\n" \
           "schedule b(Y = -2) { ranks 2 stages 2 placement v microbatches 1 }"
    assert schedule_names(text) == ["a", "b"]
    assert parameters(text, "b") == [("Y", -2)]
    assert load_text(text, schedule="b").ranks == 2
    with pytest.raises(UsageError, match=r"several schedules \(a, b\)"):
        load_text(text)
    with pytest.raises(UsageError, match=r"no schedule 'c' \(it holds: a, b\)"):
        load_text(text, schedule="c")


def test_missing_file_is_a_usage_error(tmp_path):
    with pytest.raises(UsageError, match="no such file"):
        load_file(tmp_path / "absent.pipe")


def test_parameters_of_a_file():
    assert parameters(PROGRAMS / "one_f_one_b.pipe") == [("P", 4), ("M", 8)]
    assert parameters(str(PROGRAMS / "one_f_one_b.pipe")) == [("P", 4), ("M", 8)]


def test_a_stage_on_another_rank_is_not_an_elaboration_error():
    schedule = load_text(HEAD + " rank 0 { F(1, 0) }\n}")
    assert schedule.programs[0] == (Step((Action(1, ActionKind.F, 0),)),)


def test_require_reports_the_parameter_values():
    with pytest.raises(SemanticError, match=r"requirement failed: too few \(P = 2, M = 1\)"):
        load_text(HEAD + ' require M >= P, "too few"\n}', defines={"M": 1})


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 8).flatmap(lambda p: st.tuples(st.just(p), st.integers(p, 32))))
def test_1f1b_for_any_parameters(params):
    ranks, microbatches = params
    schedule = load_file(PROGRAMS / "one_f_one_b.pipe", defines={"P": ranks, "M": microbatches})
    assert schedule.programs == programs_from_tokens(one_f_one_b_by_hand(ranks, microbatches))


@settings(max_examples=40, deadline=None)
@given(st.lists(st.sampled_from("FBIW"), max_size=24))
def test_implicit_microbatches_follow_the_explicit_bookkeeping(kinds):
    """Each implicit call names what a direct model of 'lowest not done' / 'oldest awaiting W' predicts."""
    forwarded, backwarded, awaiting_w, expected, body = set(), set(), [], [], []
    for kind in kinds:
        if kind == "F":
            chosen = min((m for m in range(8) if m not in forwarded), default=None)
            forwarded.add(chosen)
        elif kind in "BI":
            chosen = min((m for m in range(8) if m not in backwarded), default=None)
            backwarded.add(chosen)
            if kind == "I":
                awaiting_w.append(chosen)
        else:
            chosen = awaiting_w.pop(0) if awaiting_w else None
        if chosen is None:
            break
        expected.append(f"0{kind}{chosen}")
        body.append(f"{kind}(0)")
    text = f"schedule s() {{ ranks 1 stages 1 placement loop microbatches 8 rank 0 {{ {' '.join(body)} }} }}"
    assert load_text(text).programs == programs_from_tokens([expected])


def test_token_errors_point_at_the_token_inside_a_group():
    with pytest.raises(SemanticError) as caught:
        load_text(HEAD + " rank 0 { [0SEND_F1 0RECV_B9] }\n}", filename="g.pipe")
    assert caught.value.span == Span("g.pipe", 5, 21, 5, 29)
    assert "microbatch 9 is out of range" in caught.value.message


def test_a_directory_is_a_usage_error(tmp_path):
    with pytest.raises(UsageError, match="is a directory"):
        load_file(tmp_path)


def test_schedule_level_blocks_scope_their_names():
    with pytest.raises(SemanticError, match="undefined name 'x'"):
        load_text(HEAD + " if P > 0 { let x = 1 }\n rank 0 { F(0, x) }\n}")


def test_budget_stops_runaway_loops(monkeypatch):
    from pipeforge.lang import context

    monkeypatch.setattr(context, "LOOP_FUEL", 1000)
    with pytest.raises(SemanticError, match="too large to elaborate"):
        load_text(HEAD + " for i in 0 .. 100 { for j in 0 .. 100 { } }\n}")


def test_default_offsets_locate_each_default():
    text = "schedule a(X = 1) { }\nschedule b(P = 4, M = -12) { }"
    offsets = default_offsets(text, "b")
    assert [(name, value, text[start:end]) for name, value, (start, end) in offsets] == [
        ("P", 4, "4"), ("M", -12, "-12")]


def test_runs_of_tokens_keep_a_span_per_step():
    text = HEAD + " rank 0 {\n  0F0 ( 0F1 ; 1B0 )\n  [0SEND_F0  0RECV_B0] _\n  0W1\n }\n}"
    schedule = load_text(text, filename="r.pipe")
    spans = [(s.span.line, s.span.col, s.span.end_line, s.span.end_col) for s in schedule.programs[0]]
    assert spans == [(6, 3, 6, 6), (6, 7, 6, 20), (7, 3, 7, 23), (7, 24, 7, 25), (8, 3, 8, 6)]
    assert [str(step) for step in schedule.programs[0]] == ["0F0", "(0F1;1B0)", "[0SEND_F0 0RECV_B0]", "_", "0W1"]


def test_an_error_deep_in_a_run_points_at_its_action():
    with pytest.raises(SemanticError) as caught:
        load_text(HEAD + " rank 0 {\n  0F0 0F1\n  [0SEND_F0 7RECV_B0]\n }\n}", filename="r.pipe")
    assert caught.value.span == Span("r.pipe", 7, 13, 7, 21)
    assert "stage 7 is out of range" in caught.value.message


@pytest.mark.parametrize("text, message", [
    ("(0F0;)", "expected a torch action"), ("[0F0 0SEND_F0]", "mixes communication and compute"),
    ("(0F0;0SEND_F1)", "mixes communication and compute"), ("(0SEND_F1)", "may hold only compute actions"), ("0F0 0F", "needs a microbatch index"),
])
def test_malformed_token_steps_are_syntax_errors(text, message):
    from pipeforge.errors import PipeSyntaxError

    with pytest.raises(PipeSyntaxError, match=re.escape(message)):
        load_text(HEAD + f" rank 0 {{ {text} }}\n}}")


def test_a_schedule_without_parameters():
    text = "schedule cycle { ranks 1 stages 1 placement loop microbatches 1 rank 0 { 0F0 0B0 } }"
    schedule = load_text(text)
    assert schedule.params == () and parameters(text) == []
    from pipeforge.lang.printer import print_schedule

    assert print_schedule(schedule).startswith("schedule cycle {\n")
    assert load_text(print_schedule(schedule)) == schedule


def test_action_cap_stops_huge_schedules(monkeypatch):
    from pipeforge.lang import context

    monkeypatch.setattr(context, "MAX_ACTIONS", 50)
    with pytest.raises(SemanticError, match=r"emits more than 50 actions; lower its parameters \(P = 2, M = 30\)"):
        load_file(PROGRAMS / "one_f_one_b.pipe", defines={"P": 2, "M": 30})


def test_not_utf8_is_a_located_syntax_error(tmp_path):
    from pipeforge.errors import PipeSyntaxError

    path = tmp_path / "bad.pipe"
    path.write_bytes(b"schedule s() {\n  ranks 1 # caf\xe9\n}\n")
    with pytest.raises(PipeSyntaxError, match="not UTF-8 text") as caught:
        load_file(path)
    assert (caught.value.span.line, caught.value.span.col) == (2, 16)
