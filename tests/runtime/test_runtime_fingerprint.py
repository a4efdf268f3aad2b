"""Ranks agree before they compute: modules that are not one schedule are refused on every rank.

At ``make_pipeline`` every rank checks its own program against its module's
``SCHEDULE`` and exchanges a fingerprint with every other rank
(``pipeforge.runtime.fingerprint``). Before, each case below trained silently
wrong or failed on one rank only: rank 0 on 1F1B and rank 1 on another order
(gradients 0.06-0.08 off), ``M=4`` on one rank and ``M=8`` on the other (0.35
off on rank 0), a module edited to say 8 microbatches while running 4 (half
the batch trained, four losses ``None``).
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
from hypothesis import HealthCheck, Phase, given, settings

import pipeforge
import pipeforge.testing
from pipeforge.generator import codegen, rank_folder
from pipeforge.library import names
from pipeforge.runtime.fingerprint import check_program, fingerprint, record
from pipeforge.tools.generated import load_module
from pipeforge.tools.launch import spawn

WAIT = 60.0  # seconds: every exchange here ends by event; this only bounds a dead peer


def build_each(rank: int, nproc: int, payload: list[list[str]]) -> list[str]:
    """For each case (one module path per rank), build this rank's pipeline from its own module."""
    from pipeforge.tools import demo_models as models

    results = []
    for paths in payload:
        generated = load_module(paths[rank])
        info = generated.SCHEDULE
        full = models.build_stages("mlp", info.stages, seed=0)
        try:
            generated.make_pipeline({s: full[s] for s in info.stages_of(rank)}, loss_fn=models.loss_fn, timeout=WAIT)
        except pipeforge.PipeforgeError as error:
            results.append(f"{type(error).__name__}: {error}")
        else:
            results.append("built")
    return results


def generate(tmp_path, name: str, label: str, **defines) -> str:
    return str(codegen(pipeforge.load(name, defines=defines), tmp_path / f"{label}.py"))


def edited(tmp_path, source: str, label: str, change, rank: int | None = None) -> str:
    """A copy of the generated module (and its rank modules) with the main file, or rank ``rank``'s file,
    changed by ``change``."""
    original = Path(source)
    folder = tmp_path / label
    folder.mkdir()
    ranks = rank_folder(original)
    shutil.copytree(ranks, folder / ranks.name, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(original, folder / original.name)
    target = folder / original.name if rank is None else folder / ranks.name / f"rank_{rank}.py"
    target.write_text(change(target.read_text()))
    return str(folder / original.name)


@pytest.fixture(scope="module")
def refusals(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("fingerprints")
    base = generate(tmp, "1f1b", "base", P=2, M=4)
    cases = {
        "same module": [base, base],
        "another schedule": [base, generate(tmp, "gpipe", "other", P=2, M=4)],
        "another microbatch count": [base, generate(tmp, "1f1b", "eight", P=2, M=8)],
        "schedule says 8, programs run 4": [edited(tmp, base, "said8", lambda t: t.replace("microbatches=4", "microbatches=8")
                                                   .replace("'M': 4", "'M': 8"))] * 2,
        "another order on rank 1": [base, edited(tmp, base, "swapped", swap_rank_1_backwards, rank=1)],
        "a truncated rank function": [edited(tmp, base, "cut", cut_last_backward, rank=1)] * 2,
    }
    outcomes = spawn(build_each, 2, list(cases.values()), timeout=WAIT, deadline=200)
    assert all(o.ok for o in outcomes), "\n".join(o.error for o in outcomes if not o.ok)
    return {label: [o.value[index] for o in outcomes] for index, label in enumerate(cases)}


def swap_rank_1_backwards(text: str) -> str:
    """Rank 1 sends microbatch 1's gradient before microbatch 0's: another order, each message well formed."""
    head, _, rank_1 = text.partition("def rank_1(")
    rank_1 = rank_1.replace("'1SEND_B0'", "'@'").replace("'1SEND_B1'", "'1SEND_B0'").replace("'@'", "'1SEND_B1'")
    return head + "def rank_1(" + rank_1


def cut_last_backward(text: str) -> str:
    head, _, rank_1 = text.partition("def rank_1(")
    body, _, tail = rank_1.partition("\n\n\n")
    lines = body.splitlines()
    index = max(i for i, line in enumerate(lines) if line.strip().startswith("backward("))
    return head + "def rank_1(" + "\n".join(lines[:index] + lines[index + 1:]) + "\n\n\n" + tail


@pytest.mark.distributed
@pytest.mark.timeout(240)
def test_ranks_running_one_module_build_their_pipelines(refusals):
    assert refusals["same module"] == ["built", "built"]


@pytest.mark.distributed
@pytest.mark.timeout(240)
@pytest.mark.parametrize("case,fragment", [
    ("another schedule", r"rank 0 and rank 1 run different pipelines: schedule \"one_f_one_b\" on rank 0, \"gpipe\""),
    ("another microbatch count", r"rank 0 and rank 1 run different pipelines: microbatches 4 on rank 0, 8 on rank 1"),
    ("schedule says 8, programs run 4", r"rank 0's module is not what its SCHEDULE says: .*forwards microbatches 0\.\.3"),
    ("another order on rank 1", r"rank 1 and rank 0 run programs that do not pair: message 1 .* 0RECV_B0 there"),
    ("a truncated rank function", r"rank 1's module is not what its SCHEDULE says: .*runs 1F3 but never its backward"),
])
def test_ranks_that_would_run_different_programs_all_refuse_naming_both(refusals, case, fragment):
    for rank, error in enumerate(refusals[case]):
        assert error.startswith(f"PipelineUsageError: rank {rank}: "), error
        assert re.search(fragment, error), error
        assert "regenerate the modules and copy the same one to every rank" in error


def test_every_library_module_agrees_with_its_schedule(tmp_path):
    for name in names():
        schedule = pipeforge.load(name, defines={"P": 4, "M": 8})
        generated = load_module(str(codegen(schedule, tmp_path / f"m_{name.replace('-', '_')}.py")))
        for rank in range(generated.SCHEDULE.ranks):
            assert fingerprint(generated.SCHEDULE, generated.PROGRAMS, rank)["problem"] is None, (name, rank)


def test_a_program_placing_a_stage_on_another_rank_is_named(tmp_path):
    generated = load_module(generate(tmp_path, "1f1b", "one", P=2, M=2))
    actions = record(generated.PROGRAMS[1]).actions
    problem = check_program(generated.SCHEDULE, 0, actions)  # rank 1's steps read as rank 0's
    assert problem == "the module's program for rank 0 runs 1RECV_F0, which SCHEDULE places on rank 1"


def test_a_post_names_its_actions_by_token_read_once_and_refuses_any_other():
    from pipeforge.ir import parse_action
    from pipeforge.runtime.context import _GROUPS, posted
    from pipeforge.runtime.p2p import PipelineError

    group = posted(("1SEND_B0", "1RECV_F1@1"), 3)
    assert group == (parse_action("1SEND_B0"), parse_action("1RECV_F1@1"))
    assert _GROUPS[("1SEND_B0", "1RECV_F1@1")] is group  # parsed once a process
    assert posted(group, 3) is group  # the actions send_f(...) and its kin make: as they are
    for comms, why in [(("1F0",), "'1F0' is a F, not a communication action"),
                       (("1SEND_B",), "needs a microbatch index"), (("x",), "is not an action"),
                       (("1SEND_B0", parse_action("1RECV_F1")), "all by their torch tokens"),
                       ((1, 0), "all by their torch tokens"), ((), "at least one communication action")]:
        with pytest.raises(PipelineError, match=re.escape(why)) as raised:
            posted(comms, 3)
        assert str(raised.value).startswith("rank 3: post"), raised.value
    recorder = record(lambda ctx: ctx.post("0SEND_F1", "0RECV_B0"), 0)  # what the fingerprint reads: the same
    assert recorder.actions == [parse_action("0SEND_F1"), parse_action("0RECV_B0")]
    assert recorder.calls == [f"post{tuple(map(tuple, recorder.actions))!r}"]


# -- random pairs of different generated modules -------------------------------------------------------


def different_pairs(count: int) -> list[tuple]:
    pairs = []

    @settings(max_examples=count, derandomize=True, database=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck), deadline=None)
    @given(pipeforge.testing.schedules(min_ranks=2, max_ranks=2, max_microbatches=3, lowered=True),
           pipeforge.testing.schedules(min_ranks=2, max_ranks=2, max_microbatches=3, lowered=True))
    def collect(first, second):
        pairs.append((first, second))

    collect()
    return pairs


@pytest.mark.distributed
@pytest.mark.timeout(240)
def test_random_pairs_of_different_generated_modules_are_refused_before_compute(tmp_path):
    cases = []
    for index, (first, second) in enumerate(different_pairs(12)):
        paths = [str(codegen(s, tmp_path / f"pair{index}_{side}.py")) for side, s in enumerate((first, second))]
        if rank_folder(Path(paths[0])).name.rpartition("_")[2] != rank_folder(Path(paths[1])).name.rpartition("_")[2]:
            cases.append(paths)  # codegen's digest of the module's text differs: two different modules
    assert len(cases) >= 8
    outcomes = spawn(build_each, 2, cases, timeout=WAIT, deadline=200)
    assert all(o.ok for o in outcomes), "\n".join(o.error for o in outcomes if not o.ok)
    for index, paths in enumerate(cases):
        for outcome in outcomes:
            assert outcome.value[index].startswith(f"PipelineUsageError: rank {outcome.rank}: "), (paths, outcome.value[index])


def test_a_module_holding_only_its_own_rank_is_still_paired_message_by_message(tmp_path):
    """Where a rank's module holds its own program alone (no digest of the others to compare), the
    messages each rank's program sends and receives are compared in order."""
    from pipeforge.runtime.fingerprint import disagreement

    base = generate(tmp_path, "1f1b", "alone", P=2, M=4)
    swapped = load_module(edited(tmp_path, base, "alone_swapped", swap_rank_1_backwards, rank=1))
    generated = load_module(base)
    prints = {0: fingerprint(generated.SCHEDULE, {0: generated.PROGRAMS[0]}, 0),
              1: fingerprint(swapped.SCHEDULE, {1: swapped.PROGRAMS[1]}, 1)}
    assert prints[0]["module"] is None and prints[1]["module"] is None
    assert disagreement(prints, generated.SCHEDULE) == (
        "rank 1 and rank 0 run programs that do not pair: message 1 rank 1 sends rank 0 is for 0RECV_B1, but "
        "rank 0's program posts 0RECV_B0 there")
