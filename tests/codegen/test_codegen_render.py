"""Codegen: what reaches the module is identifiers and literals only; modules compile, are stable, written atomically."""

from __future__ import annotations

import ast
import itertools
import os
import re
import shutil
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pipeforge
from pipeforge.generator import Ident, codegen, finalize, generate, module_name, render_module
from pipeforge.errors import CodegenError, Span, UsageError, VerificationError
from pipeforge.files import write_atomically
from pipeforge.ir import Placement, Schedule, parse_action, parse_step, programs_from_tokens

# Lowered 1F1B on 2 ranks, 2 microbatches, communication written out.
LOWERED_ROWS = [
    ["0F0", "0SEND_F0", "0F1", "0SEND_F1", "0RECV_B0", "0B0", "0RECV_B1", "0B1"],
    ["1RECV_F0", "1F0", "1B0", "1SEND_B0", "1RECV_F1", "1F1", "1B1", "1SEND_B1"],
]


def lowered(name: str = "tiny", file: str = "tiny.pipe") -> Schedule:
    programs = tuple(
        tuple(replace(step, span=Span(file, 10 + i, 5)) for i, step in enumerate(program))
        for program in programs_from_tokens(LOWERED_ROWS)
    )
    return Schedule(name, 2, 2, 2, (Placement.loop(2, 2),), programs, params=(("P", 2), ("M", 2)))


def top_level_imports(text: str) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            names.add(f"{node.module}:{','.join(a.name for a in node.names)}")
    return names


def defined_names(text: str) -> list[str]:
    tree = ast.parse(text)
    names = []
    for node in tree.body:
        if isinstance(node, ast.FunctionDef):
            names.append(node.name)
        elif isinstance(node, ast.Assign):
            names += [t.id for t in node.targets if isinstance(t, ast.Name)]
    return names


EXPECTED_NAMES = ["SCHEDULE", "PARAMS", "rank_0", "rank_1", "PROGRAMS", "stages_of_rank", "make_pipeline"]


# -- the finalize hook and identifiers -----------------------------------------------

@pytest.mark.parametrize("value, text", [
    (Ident("forward"), "forward"),
    (3, "3"),
    (-1, "-1"),
    (2.5, "2.5"),
    (True, "True"),
    (None, "None"),
    ("x; import os", "'x; import os'"),
    ("a'b\"c\n", "'a\\'b\"c\\n'"),
])
def test_finalize_lets_identifiers_through_and_quotes_literals(value, text):
    assert finalize(value) == text


@pytest.mark.parametrize("value", [float("nan"), float("inf"), b"bytes", (1, 2), [1], {"a": 1}, object()])
def test_finalize_refuses_everything_else(value):
    with pytest.raises(CodegenError):
        finalize(value)


@pytest.mark.parametrize("text", ["x; import os", "1abc", "class", "a b", "", "rank-0", "x\ny"])
def test_ident_refuses_non_identifiers_and_keywords(text):
    with pytest.raises(CodegenError):
        Ident(text)


@pytest.mark.parametrize("name, stem", [
    ("one_f_one_b", "one_f_one_b"),
    ("x; import os", "x__import_os"),
    ("1f1b", "schedule_1f1b"),
    ("class", "schedule_class"),
    ("../../etc/passwd", "etc_passwd"),
    ("", "schedule"),
])
def test_module_name_is_a_safe_file_stem(name, stem):
    assert module_name(replace(lowered(), name=name)) == stem


# -- rendering ---------------------------------------------------------------------------

def test_module_structure_and_imports():
    text = render_module(lowered())
    assert defined_names(text) == EXPECTED_NAMES
    assert top_level_imports(text) == {"torch", "pipeforge:runtime"}
    assert "    post('0SEND_F0')  # 0SEND_F0 tiny.pipe:11:5 step 1\n" in text
    assert "    backward(1, 1)  # 1B1 tiny.pipe:16:5 step 6\n" in text


def test_locations_can_be_left_out():
    text = render_module(lowered(), locations=False)
    assert "tiny.pipe" not in text
    assert "    forward(0, 0)\n" in text


def test_same_input_gives_identical_text():
    assert render_module(lowered()) == render_module(lowered())


def test_overlap_and_chain_render_as_calls():
    rows = [["(0F1;0B0)"], ["1F0@1", "1REDUCE_GRAD"]]
    schedule = Schedule("o", 2, 2, 2, (Placement.loop(2, 2), Placement((1, 0))), programs_from_tokens(rows))
    text = render_module(schedule, locations=False)
    assert "    with ctx.overlap():\n        forward(0, 1)\n        backward(0, 0)\n" in text
    assert "    forward(1, 0, chain=1)\n    reduce_grad(1)\n" in text


def test_an_empty_program_gets_pass():
    schedule = Schedule("e", 2, 1, 1, (Placement((0,)),), programs_from_tokens([["0F0", "0B0"], []]))
    text = render_module(schedule, locations=False)
    assert "def rank_1(ctx: runtime.RankContext) -> None:\n    pass\n" in text


def test_unshard_and_reshard_become_runtime_calls():
    program = (parse_step("0UNSHARD"),) + lowered().programs[0] + (parse_step("0RESHARD"),)
    text = render_module(replace(lowered(), programs=(program, lowered().programs[1])), locations=False)
    body = text.split("def rank_0", 1)[1].split("def rank_1", 1)[0]
    assert body.index("    unshard(0)") < body.index("    forward(0, 0)")
    assert body.rstrip().endswith("    reshard(0)")


def test_every_action_kind_has_a_runtime_call():
    from pipeforge.generator import METHODS
    from pipeforge.ir import ActionKind

    assert set(METHODS) == set(ActionKind)


INJECTIONS = [
    "x; import os",
    "x'); import os; print('",
    'x"""; import os; """',
    "x\nimport os\n",
    "x\r\nimport os",
    "x\\\nimport os",
    "# \nimport os",
    "\x00\u2028import os",
]


@pytest.mark.parametrize("payload", INJECTIONS)
def test_injected_names_and_locations_never_become_code(payload):
    schedule = lowered(name=payload, file=payload)
    text = render_module(schedule)
    assert top_level_imports(text) == {"torch", "pipeforge:runtime"}
    assert defined_names(text) == EXPECTED_NAMES
    namespace: dict = {}
    exec(compile(text, "<generated>", "exec"), namespace)  # runs only literals and defs
    assert namespace["SCHEDULE"].name == payload


@settings(max_examples=60, deadline=None)
@given(name=st.text(max_size=30), file=st.text(max_size=30), line=st.integers(0, 10**6))
def test_any_name_or_span_text_stays_a_literal(name, file, line):
    schedule = lowered(name=name)
    programs = tuple(tuple(replace(s, span=Span(file, line, 1)) for s in p) for p in schedule.programs)
    text = render_module(replace(schedule, programs=programs))
    assert defined_names(text) == EXPECTED_NAMES
    assert top_level_imports(text) == {"torch", "pipeforge:runtime"}


def test_a_non_integer_in_the_schedule_is_refused():
    with pytest.raises(CodegenError, match="integer"):
        render_module(replace(lowered(), microbatches="2; import os"))


# -- verification and writing ---------------------------------------------------------------

def test_a_schedule_that_does_not_verify_is_refused_with_the_report(tmp_path):
    # rank 1 runs B before F of microbatch 0: an order violation
    rows = [["0F0", "0B0"], ["1B0", "1F0"]]
    schedule = Schedule("broken", 2, 2, 1, (Placement.loop(2, 2),), programs_from_tokens(rows))
    with pytest.raises(VerificationError) as raised:
        codegen(schedule, tmp_path)
    assert raised.value.report is not None and not raised.value.report.valid
    assert "does not verify" in str(raised.value)
    assert list(tmp_path.iterdir()) == []


def test_a_deadlocking_lowered_schedule_is_refused():
    rows = [["0F0", "0RECV_B0", "0SEND_F0", "0B0"], ["1RECV_F0", "1F0", "1B0", "1SEND_B0"]]
    schedule = Schedule("deadlock", 2, 2, 1, (Placement.loop(2, 2),), programs_from_tokens(rows))
    with pytest.raises(VerificationError) as raised:
        generate(schedule)
    kinds = {v.kind for v in raised.value.report.violations}
    assert "deadlock" in kinds


def test_codegen_lowers_verifies_and_writes_a_library_schedule(tmp_path):
    schedule = pipeforge.load("1f1b", defines={"P": 2, "M": 3})
    path = codegen(schedule, tmp_path)
    assert path == tmp_path / "one_f_one_b.py"
    text = path.read_text()
    compile(text, str(path), "exec")
    (folder,) = tmp_path.glob("one_f_one_b_ranks_*")
    assert f"RANK_FOLDER = {folder.name!r}" in text
    assert sorted(p.name for p in tmp_path.iterdir()) == ["one_f_one_b.py", folder.name]
    assert sorted(p.name for p in folder.iterdir() if p.name != "__pycache__") == ["rank_0.py", "rank_1.py"]
    for rank in (0, 1):
        rank_text = (folder / f"rank_{rank}.py").read_text()
        compile(rank_text, "rank", "exec")
        assert "1f1b.pipe:" in rank_text and f"def rank_{rank}(ctx: RankContext) -> None:" in rank_text


@pytest.mark.parametrize("failing", ["rename", "replace"])
def test_a_failed_write_leaves_the_old_output_whole(tmp_path, monkeypatch, failing):
    schedule = pipeforge.load("1f1b", defines={"P": 2, "M": 3})
    path = codegen(schedule, tmp_path, locations=False)
    before = {p.relative_to(tmp_path): p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}

    def broken(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(os, failing, broken)
    with pytest.raises(UsageError, match="disk full"):
        codegen(schedule, tmp_path)  # with locations: other rank modules, another folder
    after = {p.relative_to(tmp_path): p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    assert after == before and sorted(p.name for p in tmp_path.iterdir()) == sorted(
        {str(p).split("/")[0] for p in before})
    assert path.exists()


def test_write_is_atomic_and_leaves_no_partial_file(tmp_path, monkeypatch):
    target = tmp_path / "m.py"
    write_atomically(target, "OLD = 1\n")

    def broken_replace(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", broken_replace)
    with pytest.raises(UsageError, match="disk full"):  # a user-facing error, exit 2
        write_atomically(target, "NEW = 2\n")
    assert target.read_text() == "OLD = 1\n"
    assert [p.name for p in tmp_path.iterdir()] == ["m.py"]


PROGRAMS = Path(__file__).parent / "programs"


@pytest.mark.parametrize("name", ["lowered_1f1b", "overlap_chains"])
def test_golden_modules_of_hand_lowered_programs(name, goldens):
    # communication written out: verified as written, so the golden depends on codegen alone
    text = generate(pipeforge.load(str(PROGRAMS / f"{name}.pipe")), locations=False)
    goldens.check(f"{name}.py.txt", text)


def test_library_schedules_generate(tmp_path):
    for name, defines in [("1f1b", {"P": 2, "M": 3}), ("dualpipev", {"P": 2, "M": 4}), ("chimera", {"P": 2, "M": 2})]:
        text = generate(pipeforge.load(name, defines=defines))
        assert defined_names(text) == EXPECTED_NAMES


def test_every_step_of_the_lowered_schedule_appears_in_order():
    schedule = pipeforge.lower(pipeforge.load("interleaved-1f1b", defines={"P": 2, "M": 4}))
    text = render_module(schedule, locations=False)
    tree = ast.parse(text)
    for rank, program in enumerate(schedule.programs):
        function = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == f"rank_{rank}")
        bound = list(itertools.takewhile(lambda n: isinstance(n, ast.Assign), function.body))
        assert len(function.body) - len(bound) == sum(1 for step in program if not step.is_idle)
        names = [ast.unparse(target) for statement in bound for target in _items(statement.targets[0])]
        assert [ast.unparse(value) for statement in bound for value in _items(statement.value)] == \
            [f"ctx.{name}" for name in names]  # each method it calls bound once, and only those
        called = {node.func.id for node in ast.walk(function) if isinstance(node, ast.Call)
                  and isinstance(node.func, ast.Name)}
        assert sorted(names) == sorted(called)
        posts = [node for node in ast.walk(function) if isinstance(node, ast.Call) and ast.unparse(node.func) == "post"]
        groups = [step.actions for step in program if step.actions and step.actions[0].kind.is_comm]
        assert [tuple(parse_action(arg.value) for arg in node.args) for node in posts] == groups  # by token, in order


def _items(node: ast.expr) -> list[ast.expr]:
    """A binding's names or values: one name alone, or a tuple's."""
    return list(node.elts) if isinstance(node, ast.Tuple) else [node]


def test_a_post_past_a_line_names_a_token_a_line():
    from pipeforge.generator import GROUP_LINE

    tokens = ["1SEND_B0", "1RECV_F1", "1SEND_F0@1", "1RECV_B1@1"]
    schedule = Schedule("g", 2, 2, 2, (Placement.loop(2, 2), Placement((1, 0))), programs_from_tokens([[], []]))
    program = (parse_step(f"[{' '.join(tokens[:2])}]"), parse_step(f"[{' '.join(tokens * 4)}]"))
    text = render_module(replace(schedule, programs=((), program)), locations=False)
    assert "    post('1SEND_B0', '1RECV_F1')\n" in text
    long = "    post(\n" + "".join(f"        {token!r},\n" for token in tokens * 4) + "    )\n"
    assert long in text and len(f"    post({', '.join(map(repr, tokens * 4))})") > GROUP_LINE



# -- comments: torch token, 'file':line:col, verify's step index ------------------------------

COMMENT = re.compile(r"  # (?P<token>\S+(?: \S+)*?) (?P<file>'[^']*'|\S+?):(?P<line>\d+):(?P<col>\d+) "
                     r"step (?P<step>\d+)$")


def comments_by_rank(text: str) -> dict[int, list[re.Match]]:
    """Each rank function's step comments, in order."""
    found: dict[int, list[re.Match]] = {}
    rank = None
    for line in text.splitlines():
        if line.startswith("def rank_"):
            rank = int(line[len("def rank_"):line.index("(")])
            found[rank] = []
        elif rank is not None and (match := COMMENT.search(line)):
            found[rank].append(match)
    return found


@pytest.mark.parametrize("name, defines", [("1f1b", {"P": 2, "M": 3}), ("zb-h1", {"P": 3, "M": 4}),
                                           ("dualpipev", {"P": 2, "M": 4}), ("chimera", {"P": 2, "M": 2})])
def test_comments_name_the_token_location_and_written_step(name, defines):
    schedule = pipeforge.load(name, defines=defines)
    lowered_program = pipeforge.lower(schedule).programs
    comments = comments_by_rank(generate(schedule))
    for rank, program in enumerate(lowered_program):
        steps = [step for step in program if not step.is_idle]
        assert [m["token"] for m in comments[rank]] == [str(step) for step in steps]
        for match, step in zip(comments[rank], steps):
            written = schedule.programs[rank][int(match["step"])]
            assert (int(match["line"]), int(match["col"])) == (step.span.line, step.span.col)
            if step.is_compute:  # a compute step is the written step itself; a group serves it
                assert str(written) == match["token"]


def test_the_step_verify_reports_is_the_step_the_comment_names():
    # a valid schedule checked under a tight memory limit: verify names rank, step and action
    schedule = pipeforge.load("zb-h1", defines={"P": 4, "M": 8})
    report = pipeforge.verify(schedule, memory_limit=2)
    assert report.violations
    comments = comments_by_rank(generate(schedule))
    for violation in report.violations:
        token = re.search(r" at (\S+),", violation.message)[1]
        (match,) = [m for m in comments[violation.rank] if m["step"] == str(violation.step) and m["token"] == token]
        assert violation.location.endswith(f"{match['file']}:{match['line']}:{match['col']}")


def test_an_overlap_comment_is_the_overlap_token():
    rows = [["(0F1;0B0)"], ["1F0@1", "1REDUCE_GRAD"]]
    programs = tuple(tuple(replace(s, span=Span("o.pipe", 3, 7)) for s in p) for p in programs_from_tokens(rows))
    schedule = Schedule("o", 2, 2, 2, (Placement.loop(2, 2), Placement((1, 0))), programs)
    text = render_module(schedule)
    assert "    with ctx.overlap():  # (0F1;0B0) o.pipe:3:7 step 0\n        forward(0, 1)\n" in text
    assert "    forward(1, 0, chain=1)  # 1F0@1 o.pipe:3:7 step 0\n" in text


# -- naming the module and never overwriting another schedule's ------------------------------

def test_output_file_names_the_module(tmp_path):
    schedule = pipeforge.load("1f1b", defines={"P": 2, "M": 3})
    assert codegen(schedule, tmp_path / "mine.py") == tmp_path / "mine.py"
    assert codegen(schedule, tmp_path, name="other") == tmp_path / "other.py"
    assert sorted(p.name for p in tmp_path.glob("*.py")) == ["mine.py", "other.py"]
    assert sorted(p.name.split("_ranks_")[0] for p in tmp_path.glob("*_ranks_*")) == ["mine", "other"]


@pytest.mark.parametrize("output, name", [("my-mod.py", None), ("1x.py", None), ("class.py", None),
                                          ("", "a b"), ("", "import"), ("", "x.py"), ("m.py", "n")])
def test_a_module_name_that_cannot_be_imported_is_refused(tmp_path, output, name):
    schedule = pipeforge.load("1f1b", defines={"P": 2, "M": 2})
    with pytest.raises(UsageError, match="module name|name different modules"):
        codegen(schedule, tmp_path / output, name=name)
    assert list(tmp_path.iterdir()) == []


def test_two_schedules_never_overwrite_each_other(tmp_path):
    small = pipeforge.load("1f1b", defines={"P": 2, "M": 2})
    large = pipeforge.load("1f1b", defines={"P": 2, "M": 4})
    path = codegen(small, tmp_path)
    first = path.read_text()
    assert codegen(small, tmp_path) == path  # the same schedule again: regenerated
    with pytest.raises(UsageError, match=r"holds the module of schedule 'one_f_one_b' \(P=2, M=2\).*name=NAME"):
        codegen(large, tmp_path)
    assert path.read_text() == first
    other = pipeforge.load("gpipe", defines={"P": 2, "M": 2})
    with pytest.raises(UsageError, match="holds the module of schedule 'one_f_one_b'"):
        codegen(other, path)
    assert codegen(large, tmp_path, force=True) == path
    assert "microbatches=4" in path.read_text()


def test_a_file_pipeforge_did_not_write_is_not_replaced(tmp_path):
    target = tmp_path / "mine.py"
    target.write_text("print('my code')\n")
    with pytest.raises(UsageError, match="not a module pipeforge wrote"):
        codegen(pipeforge.load("1f1b", defines={"P": 2, "M": 2}), target)
    assert target.read_text() == "print('my code')\n"


def test_stages_of_rank_names_the_stages_a_rank_builds():
    from pipeforge.runtime import PipelineError

    namespace: dict = {}
    exec(compile(generate(pipeforge.load("zbv", defines={"P": 2, "M": 4})), "<zbv>", "exec"), namespace)
    assert [namespace["stages_of_rank"](r) for r in range(2)] == [(0, 3), (1, 2)]
    with pytest.raises(PipelineError, match="rank 2 is out of range"):
        namespace["stages_of_rank"](2)


def test_a_rank_imports_only_its_own_module(tmp_path):
    from pipeforge.runtime import PipelineError
    from pipeforge.tools.generated import load_module

    schedule = pipeforge.load("interleaved-1f1b", defines={"P": 4, "M": 8})
    module = load_module(str(codegen(schedule, tmp_path)))
    (folder,) = tmp_path.glob("interleaved_1f1b_ranks_*")
    assert module.RANK_FOLDER == folder.name and len(module.PROGRAMS) == 4
    before = set(sys.modules)
    program = module.PROGRAMS[2]
    loaded = {name for name in set(sys.modules) - before if name.startswith("pipeforge_rank_")}
    assert program.__name__ == "rank_2" and program.__code__.co_filename == str((folder / "rank_2.py").resolve())
    assert len(loaded) == 1 and module.PROGRAMS[2] is program  # that rank's module alone, once
    shutil.rmtree(folder)
    with pytest.raises(PipelineError, match=r"rank 3: the generated module's rank file .*rank_3\.py' is missing"):
        module.PROGRAMS[3]
