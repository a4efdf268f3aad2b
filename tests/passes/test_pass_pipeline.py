"""Passes as named objects in a pipeline (torch's order, a callback after each), and ``--verify-each``."""

from __future__ import annotations

import dataclasses

import pytest

import pipeforge
from pipeforge.cli import main
from pipeforge.ir import replace_programs
from pipeforge.passes import (PASSES, PassOptions, PassPipeline, SchedulePass, apply_passes, defer_recv, lower,
                              merge_bw, reduce_grad, unshard)
from pipeforge.passes.pipeline import Unshard

SMALL = ["-D", "P=3", "-D", "M=4"]


def test_the_registry_names_each_pass_by_its_flag_in_torchs_order(capsys):
    assert list(PASSES) == ["merge-bw", "unshard", "reduce-grad", "lower", "defer-recv"]
    for name, cls in PASSES.items():
        assert cls.name == name and dataclasses.is_dataclass(cls)
        assert cls.__dataclass_params__.frozen
    with pytest.raises(SystemExit):
        main(["lower", "--help"])
    help_text = capsys.readouterr().out
    assert all(f"--{name}" in help_text for name in PASSES if name != "lower")


def test_options_name_the_passes_in_the_registrys_order_whatever_was_asked_first():
    options = PassOptions(unshard=2, reduce_grad=True, merge_bw=True, defer_recv=True)
    assert [p.name for p in options.passes(lower=True)] == list(PASSES)
    assert [p.name for p in PassOptions(defer_recv=True, unshard=1).passes()] == ["unshard", "defer-recv"]
    assert options.passes(lower=True)[1] == Unshard(2)


def test_the_pipeline_is_the_passes_composed_and_calls_back_after_each():
    schedule = pipeforge.load("zbv", defines={"P": 3, "M": 4})
    seen: list[tuple[str, object]] = []
    options = PassOptions(unshard=3, merge_bw=True, reduce_grad=True, defer_recv=True)
    out = apply_passes(schedule, options, lower=True, callback=lambda p, s: seen.append((p.name, s)))
    by_hand = defer_recv(lower(reduce_grad(unshard(merge_bw(schedule), 3))))
    assert out == by_hand
    assert [name for name, _ in seen] == ["merge-bw", "unshard", "reduce-grad", "lower", "defer-recv"]
    assert seen[0][1] == merge_bw(schedule) and seen[-1][1] == out


@dataclasses.dataclass(frozen=True)
class DropFirstStep(SchedulePass):
    """A deliberately broken pass: rank 0 loses its first step (a forward that others need)."""

    name = "drop-first-step"

    def apply(self, schedule):
        return replace_programs(schedule, (schedule.programs[0][1:],) + schedule.programs[1:])


def test_a_pipeline_with_a_broken_pass_still_applies_it_and_the_callback_sees_which():
    schedule = pipeforge.load("1f1b", defines={"P": 2, "M": 2})
    verdicts = []
    PassPipeline((DropFirstStep(), PASSES["lower"]()),
                 lambda p, s: verdicts.append((p.name, pipeforge.verify(s).valid))).apply(schedule)
    assert verdicts == [("drop-first-step", False), ("lower", False)]


def _break_unshard(monkeypatch):
    real = Unshard.apply
    monkeypatch.setattr(Unshard, "apply", lambda self, schedule: DropFirstStep().apply(real(self, schedule)))


@pytest.mark.parametrize("command", [["lower"], ["codegen", "-o", "OUT"]])
def test_verify_each_names_the_pass_that_broke_the_schedule(command, monkeypatch, tmp_path, capsys):
    _break_unshard(monkeypatch)
    argv = [command[0], "1f1b", *SMALL, "--merge-bw", "--unshard", "2", *[str(tmp_path / a) if a == "OUT" else a
                                                                           for a in command[1:]]]
    assert main([*argv, "--verify-each"]) == 1
    err = capsys.readouterr().err
    assert "--verify-each: pass 'unshard' broke schedule 'one_f_one_b'" in err
    assert "merge-bw" not in err.split("broke")[0]
    assert not list(tmp_path.iterdir())  # nothing written
    assert main(argv) == 1  # without it the final check still refuses, but names no pass
    assert "pass 'unshard'" not in capsys.readouterr().err


def test_verify_each_refuses_an_input_that_does_not_verify_before_any_pass(tmp_path, capsys):
    bad = tmp_path / "bad.pipe"
    bad.write_text("schedule bad { ranks 2 stages 2 placement loop microbatches 1\n"
                   "  rank 0 { 0B0 0F0 } rank 1 { 1F0 1B0 } }\n")
    assert main(["lower", str(bad), "--unshard", "1", "--verify-each"]) == 1
    assert "before any pass" in capsys.readouterr().err


@pytest.mark.parametrize("flags", [[], ["--merge-bw", "--unshard", "3", "--reduce-grad", "--defer-recv"]])
def test_verify_each_changes_nothing_in_what_a_valid_schedule_gives(flags, capsys):
    assert main(["lower", "zbv", *SMALL, *flags]) == 0
    plain = capsys.readouterr()
    assert main(["lower", "zbv", *SMALL, *flags, "--verify-each"]) == 0
    checked = capsys.readouterr()
    assert (checked.out, checked.err) == (plain.out, plain.err)
