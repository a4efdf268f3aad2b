"""Real hangs on gloo, each diagnosed from the records alone (``make_pipeline(records=DIR)``, ``pipeforge diagnose``).

Six hangs: three wait cycles made by hand-editing a generated module (over two
ranks; over three ranks of a looped placement; a wait moved before a send, which
pairs the same messages, so the ranks' agreement at ``make_pipeline`` lets it run),
a rank that stops inside a compute (1F1B, and ZB-V's second stage of a rank), a rank
that fails with an error. (A receive or send deleted from a program no longer runs:
``make_pipeline`` refuses programs that do not pair, tested here too.) For each, every rank leaves a record, its error names the
record, and ``pipeforge diagnose DIR`` names the ranks and actions of the cycle (or
of the chain ending at the rank that stopped) with their ``.pipe`` places, in under
5 s. Bad input to ``diagnose`` is refused with exit 2.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pipeforge.tools.launch import spawn
from tests.load import SCALE, scaled

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT = round(scaled(3.0), 1)  # the ranks' wait for a peer, times the load: a hang is caught in the same multiple
DIAGNOSE_WITHIN = scaled(5.0)

THREE_RANKS_M1 = """\
# three ranks, two stages each (loop), one microbatch
schedule looped(P = 3, M = 1) {
    ranks P
    stages 2 * P placement loop
    microbatches M
    rank r {
        F(r, 0)
        F(r + P, 0)
        B(r + P, 0)
        B(r, 0)
    }
}
"""


def codegen(source: str, out: Path, defines: dict[str, int] | None = None) -> Path:
    args = [sys.executable, "-m", "pipeforge", "codegen", source, "-o", str(out)]
    for name, value in (defines or {}).items():
        args += ["-D", f"{name}={value}"]
    done = subprocess.run(args, capture_output=True, text=True, cwd=out.parent, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    return next(out.glob("*.py"))


def rank_function(text: str, rank: int) -> tuple[int, int]:
    """The line range of ``def rank_<rank>`` in the module text."""
    lines = text.split("\n")
    start = next(i for i, line in enumerate(lines) if line.startswith(f"def rank_{rank}("))
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("def ")), len(lines))
    return start, end


def edit(path: Path, rank: int, *, move: str | None = None, after: str | None = None, delete: str | None = None):
    """Move the statement line starting with ``move`` after the line starting with ``after``, or delete one
    (in the module's file, or in its rank module where the rank's function lives there)."""
    from pipeforge.generator import rank_folder

    if f"def rank_{rank}(" not in path.read_text() and rank_folder(path) is not None:
        path = rank_folder(path) / f"rank_{rank}.py"
    lines = path.read_text().split("\n")
    start, end = rank_function("\n".join(lines), rank)
    body = lines[start:end]
    at = lambda prefix: next(i for i, line in enumerate(body) if line.strip().startswith(prefix))
    if delete is not None:
        body.pop(at(delete))
    else:
        line = body.pop(at(move))
        body.insert(at(after) + 1, line)
    lines[start:end] = body
    path.write_text("\n".join(lines))


def run_case(module: Path, ranks: int, records: Path, *, stop: dict | None = None, environment: bool = False):
    job = {"module": str(module), "records": str(records), "timeout": TIMEOUT, "stop": stop,
           "environment": environment}
    return spawn("tests.runtime.hang_jobs:run_hang", ranks, job, timeout=TIMEOUT + scaled(2),
                 deadline=4 * TIMEOUT / SCALE + 12)


def diagnose(records: Path) -> tuple[dict, str, float]:
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "pipeforge", "diagnose", str(records), "--json"],
                          capture_output=True, text=True, cwd=ROOT, timeout=60, check=False)
    seconds = time.monotonic() - started
    assert done.returncode == 0, done.stderr
    text = subprocess.run([sys.executable, "-m", "pipeforge", "diagnose", str(records)], capture_output=True,
                          text=True, cwd=ROOT, timeout=60, check=False).stdout
    return json.loads(done.stdout), text, seconds


def hops_of(found: dict) -> list[tuple[int, str, str]]:
    return [(hop["rank"], hop["action"], hop["waits_for"]) for hop in found["hops"]]


def check_errors_name_records(outcomes, records: Path, failing: set[int]) -> None:
    for outcome in outcomes:
        if outcome.rank in failing:
            kind, message = outcome.value
            assert kind == "failed" and str(records / f"rank-{outcome.rank}.json") in message, message


def case_two_rank_cycle(tmp: Path):
    """1F1B, 2 ranks: rank 0 sends microbatch 1 only after B0, rank 1 forwards it before B0."""
    module = codegen("1f1b", tmp / "gen", {"P": 2, "M": 2})
    edit(module, 0, move="post('0SEND_F1')", after="backward(0, 0)")
    edit(module, 1, move="forward(1, 1)", after="post('1RECV_F1')")
    return module, 2, {}, {0, 1}


def case_three_rank_cycle(tmp: Path):
    """Stages on a loop of 3 ranks: rank 0 sends stage 0's output only after its stage 3 forward."""
    source = tmp / "looped.pipe"
    source.write_text(THREE_RANKS_M1)
    module = codegen(str(source), tmp / "gen")
    edit(module, 0, move="post('0SEND_F0')", after="forward(3, 0)")
    return module, 3, {}, {0, 1, 2}


def case_rank_stops(tmp: Path):
    """1F1B, 2 ranks: rank 1 stops inside its forward of microbatch 1."""
    module = codegen("1f1b", tmp / "gen", {"P": 2, "M": 2})
    return module, 2, {"stop": {"stage": 1, "call": 1, "how": "sleep"}}, {0}


def case_rank_fails(tmp: Path):
    """1F1B, 3 ranks: rank 1's stage raises on its third forward (PIPEFORGE_RECORDS names the directory)."""
    module = codegen("1f1b", tmp / "gen", {"P": 3, "M": 3})
    return module, 3, {"stop": {"stage": 1, "call": 2, "how": "raise"}, "environment": True}, {0, 1, 2}


def case_receive_deleted(tmp: Path):
    """1F1B, 2 ranks: rank 1's program lost the receive of microbatch 1's input."""
    module = codegen("1f1b", tmp / "gen", {"P": 2, "M": 2})
    edit(module, 1, delete="post('1RECV_F1')")
    return module, 2, {}, {0, 1}


def case_send_deleted(tmp: Path):
    """1F1B, 3 ranks: rank 1's program lost the send of microbatch 2's gradient (and finishes its step)."""
    module = codegen("1f1b", tmp / "gen", {"P": 3, "M": 3})
    edit(module, 1, delete="post('1SEND_B2')")
    return module, 3, {}, {0}


def case_wait_before_send(tmp: Path):
    """1F1B, 3 ranks: rank 1 waits for microbatch 0's gradient before it sends microbatch 0's activation."""
    module = codegen("1f1b", tmp / "gen", {"P": 3, "M": 3})
    edit(module, 1, move="post('1RECV_B0')", after="forward(1, 0)")
    edit(module, 1, move="backward(1, 0)", after="post('1RECV_B0')")
    return module, 3, {}, {0, 1, 2}


def case_v_rank_stops(tmp: Path):
    """ZB-V, 2 ranks: rank 0 stops inside the forward of its second stage (stage 3) on microbatch 1."""
    module = codegen("zbv", tmp / "gen", {"P": 2, "M": 4})
    return module, 2, {"stop": {"stage": 3, "call": 1, "how": "sleep"}}, {1}


# case -> (the hops diagnose must give: rank, action, what it waits for; cycle or how the chain ends)
EXPECTED = {
    # on the first step a receive of activations waits for their shapes where it is posted
    case_two_rank_cycle: ([(0, "0B0", "0RECV_B0"), (1, "1RECV_F1", "1RECV_F1")], True, None),
    case_three_rank_cycle: ([(0, "3RECV_F0", "3RECV_F0"), (2, "2RECV_F0", "2RECV_F0"),
                             (1, "1RECV_F0", "1RECV_F0")], True, None),
    case_rank_stops: ([(0, "0B1", "0RECV_B1")], False, "rank 1 stopped at 1F1"),
    case_rank_fails: ([(0, "0B1", "0RECV_B1")], False, "fails on purpose"),
    case_wait_before_send: ([(1, "1B0", "1RECV_B0"), (2, "2RECV_F0", "2RECV_F0")], True, None),  # rank 0 waits on it
    case_v_rank_stops: (None, False, "rank 0 stopped at 3F1"),
}
# A program that lost a receive or a send no longer hangs: make_pipeline refuses it on every rank before any
# compute (its messages do not pair with its peer's: pipeforge.runtime.fingerprint).
REFUSED = {
    case_receive_deleted: "rank 0 and rank 1 run programs that do not pair: rank 0 sends rank 1 2 messages, "
                          "rank 1's program receives 1 from it",
    case_send_deleted: "rank 1 and rank 0 run programs that do not pair: rank 1 sends rank 0 2 messages, "
                       "rank 0's program receives 3 from it",
}


@pytest.mark.distributed
@pytest.mark.timeout(300)
@pytest.mark.parametrize("case", list(EXPECTED), ids=lambda case: case.__name__.removeprefix("case_"))
def test_each_real_hang_is_diagnosed_from_the_records(case, tmp_path):
    module, ranks, options, failing = case(tmp_path)
    records = tmp_path / "records"
    outcomes = run_case(module, ranks, records, **options)
    assert not all(o.ok and o.value[0] == "ok" for o in outcomes), "the step was expected to hang or fail"
    check_errors_name_records(outcomes, records, failing)
    assert sorted(p.name for p in records.iterdir()) == [f"rank-{r}.json" for r in range(ranks)]
    found, text, seconds = diagnose(records)
    hops, cycle, ending = EXPECTED[case]
    assert seconds < DIAGNOSE_WITHIN
    assert found["cycle"] is cycle, text
    if hops is not None:
        assert hops_of(found) == hops, text
    if ending is not None:
        assert ending in (found["end"] or "") + text, text
    assert all(hop["location"] and re.search(r"\.pipe'?:\d+:\d+", hop["location"]) for hop in found["hops"]), text
    assert "^" in text  # the carets under each hop's place in the source


@pytest.mark.distributed
@pytest.mark.timeout(300)
@pytest.mark.parametrize("case", list(REFUSED), ids=lambda case: case.__name__.removeprefix("case_"))
def test_a_program_that_lost_a_message_is_refused_before_it_can_hang(case, tmp_path):
    module, ranks, options, _ = case(tmp_path)
    outcomes = run_case(module, ranks, tmp_path / "records", **options)
    for outcome in outcomes:
        assert not outcome.ok and f"PipelineError: rank {outcome.rank}: " in outcome.error, outcome
        assert REFUSED[case] in outcome.error, outcome.error


# --- bad input ----------------------------------------------------------------------------------


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pipeforge", *args], capture_output=True, text=True, cwd=ROOT,
                          timeout=60, check=False)


def fake_records(tmp_path: Path, ranks: int = 2, **changes) -> Path:
    """Records as two ranks of 1F1B would leave them (written by the Recorder itself)."""
    from pipeforge.runtime.context import ScheduleInfo
    from pipeforge.runtime.records import Recorder
    from tests.runtime.hang_jobs import load

    module = codegen("1f1b", tmp_path / "gen", {"P": ranks, "M": 2})
    loaded = load(str(module), "fake_records_module")
    info: ScheduleInfo = loaded.SCHEDULE
    folder = tmp_path / "records"
    for rank in range(ranks):
        recorder = Recorder(folder, info, rank, loaded.PROGRAMS[rank], None)
        recorder.begin_step()
        recorder.begin_compute("F", rank, 0, 0)
        recorder.begin_wait("RECV_B" if rank == 0 else "RECV_F", rank, 0, 0)
        recorder.failed(RuntimeError("timed out"))
    return folder


def test_diagnose_refuses_bad_input_with_exit_2(tmp_path):
    folder = fake_records(tmp_path)
    assert cli("diagnose", str(folder)).returncode == 0
    record = folder / "rank-1.json"
    whole = record.read_text()
    cases = [
        ("truncated", lambda: record.write_text(whole[: len(whole) // 2]), "not a complete record"),
        ("missing", record.unlink, "records of ranks [1] are missing"),
        ("another schedule", lambda: record.write_text(json.dumps(
            {**json.loads(whole), "schedule": "another", "fingerprint": "0" * 16})), "records of another schedule"),
        ("another step", lambda: record.write_text(json.dumps({**json.loads(whole), "step_index": 4})),
         "records of different steps"),
        ("not a record", lambda: record.write_text("[1, 2]"), "not a pipeforge record"),
    ]
    for label, damage, expected in cases:
        damage()
        done = cli("diagnose", str(folder))
        assert done.returncode == 2, (label, done.stdout, done.stderr)
        assert expected in done.stderr and "Traceback" not in done.stderr, (label, done.stderr)
        record.write_text(whole)
    empty = tmp_path / "empty"
    empty.mkdir()
    assert cli("diagnose", str(empty)).returncode == 2
    assert cli("diagnose", str(tmp_path / "nowhere")).returncode == 2


def test_torch_flight_recorder_holds_no_gloo_entries(tmp_path):
    """torch 2.13 keeps a CPU flight recorder (``_dump_fr_trace_json``), but records nothing of gloo's
    point-to-point operations there, so there is no dump of a hung gloo run to read."""
    outcomes = spawn("tests.runtime.hang_jobs:flight_recorder_dump", 2, None, timeout=20, deadline=60)
    assert all(o.ok for o in outcomes), [o.error for o in outcomes]
    for outcome in outcomes:
        dump = json.loads(outcome.value)
        assert not dump.get("entries"), dump


def test_a_rank_function_s_statements_are_read_in_every_call_form():
    """Posts naming their actions by token (``post('0SEND_F1')``, what codegen writes), and the forms of
    modules generated before: calls of the names the rank function binds (``post(send_f(0, 1))``) and of
    ``ctx.`` (before it bound them): the same statements."""
    import ast

    from pipeforge.ir import parse_action
    from pipeforge.tools.diagnose import statements

    tokens = ("def rank_0(ctx):\n    forward, post = ctx.forward, ctx.post\n"
              "    forward(0, 1)  # 0F1 x.pipe:3:4 step 2\n    post('0SEND_F1')  # 0SEND_F1 x.pipe:3:4 step 2\n"
              "    post('0SEND_F2', '0SEND_F3')  # [0SEND_F2 0SEND_F3] x.pipe:3:4 step 3\n")
    bound = ("def rank_0(ctx):\n    forward, post, send_f = ctx.forward, ctx.post, ctx.send_f\n"
             "    forward(0, 1)  # 0F1 x.pipe:3:4 step 2\n    post(send_f(0, 1))  # 0SEND_F1 x.pipe:3:4 step 2\n"
             "    post(  # [0SEND_F2 0SEND_F3] x.pipe:3:4 step 3\n        send_f(0, 2),\n        send_f(0, 3),\n    )\n")
    before = bound.replace("    forward, post, send_f = ctx.forward, ctx.post, ctx.send_f\n", "") \
        .replace("forward(", "ctx.forward(").replace("post(", "ctx.post(").replace("send_f(", "ctx.send_f(")
    for text in (tokens, bound, before):
        found = statements(ast.parse(text).body[0], text.splitlines(), Path("."))
        assert [(s.actions, s.token, s.step) for s in found] == [
            ((parse_action("0F1"),), "0F1", 2), ((parse_action("0SEND_F1"),), "0SEND_F1", 2),
            ((parse_action("0SEND_F2"), parse_action("0SEND_F3")), "[0SEND_F2 0SEND_F3]", 3)], text
