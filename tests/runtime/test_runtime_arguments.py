"""``make_pipeline``'s plain arguments and ``step(losses=...)``: a wrong value is a ``PipelineUsageError``
naming the rank and the argument, never torch's or the standard library's error about its own internals.

Before: ``timeout=float('inf')`` was timedelta's OverflowError, ``device='bogus'`` torch's RuntimeError,
``group='x'`` an AttributeError inside ``get_world_size``, ``custom_functions=[f]`` an AttributeError,
``records=5`` pathlib's TypeError; ``loss_fn=3``, ``scale_grads='no'``, ``records`` naming a file and
``timeout=0`` passed unnoticed; ``losses=()`` raised an AttributeError after the step had accumulated its
gradients; a loss that needs no gradient failed at its backward with autograd's words.
"""

from __future__ import annotations

import math
from datetime import timedelta

import pytest
import torch

from pipeforge.runtime import PipelineUsageError
from pipeforge.runtime.arguments import (
    check_callable,
    check_flag,
    check_group,
    checked_device,
    checked_records,
    checked_timeout,
)


@pytest.mark.parametrize("timeout", ["30", True, 0, -1, math.nan, math.inf, 1e300, 10 ** 400, 10 ** 5000, [30]],
                         ids=["str", "bool", "zero", "negative", "nan", "inf", "1e300", "10**400", "10**5000", "list"])
def test_a_timeout_that_is_not_a_positive_number_of_seconds_is_refused(timeout):
    with pytest.raises(PipelineUsageError, match=r"rank 3: make_pipeline\(timeout="):
        checked_timeout(timeout, 3)


def test_a_timeout_in_seconds_or_as_a_timedelta():
    assert checked_timeout(None, 0) is None
    assert checked_timeout(30, 0) == 30.0
    assert checked_timeout(timedelta(minutes=2), 0) == 120.0


@pytest.mark.parametrize("device, message", [
    ("bogus", "is not a device"), (object(), "is not a device"), ("meta", "a meta tensor holds no values"),
    pytest.param("cuda:99", "CUDA device(s)", id="cuda-index"),
])
def test_a_device_this_process_cannot_use_is_refused(device, message):
    with pytest.raises(PipelineUsageError, match=r"rank 1: make_pipeline\(device=") as raised:
        checked_device(device, 1)
    assert message in str(raised.value)


def test_a_device_torch_reads_is_kept():
    assert checked_device("cpu", 0) == torch.device("cpu")
    assert checked_device(torch.device("cpu"), 0) == torch.device("cpu")


@pytest.mark.parametrize("name", ["group", "dp_group"])
def test_a_group_that_is_not_a_process_group_is_refused(name):
    check_group(None, name)
    with pytest.raises(PipelineUsageError, match=rf"make_pipeline\({name}=...\) must be a torch.distributed "
                                                 "ProcessGroup"):
        check_group("world", name)


def test_flags_and_callables_are_what_they_say():
    check_flag(False, "scale_grads", 0)
    check_callable(None, "loss_fn", 0)
    with pytest.raises(PipelineUsageError, match=r"rank 0: make_pipeline\(scale_grads=...\) must be True or False, "
                                                 "got str 'no'"):
        check_flag("no", "scale_grads", 0)
    with pytest.raises(PipelineUsageError, match=r"rank 2: make_pipeline\(loss_fn=...\) must be callable"):
        check_callable(3, "loss_fn", 2)


def test_records_must_name_a_directory_or_where_one_can_be_made(tmp_path, monkeypatch):
    monkeypatch.delenv("PIPEFORGE_RECORDS", raising=False)
    (tmp_path / "notes").write_text("x")
    assert checked_records(None, 0) is None
    assert checked_records(tmp_path / "new" / "deeper", 0) == tmp_path / "new" / "deeper"
    with pytest.raises(PipelineUsageError, match="must be a directory path"):
        checked_records(5, 0)
    for path in (tmp_path / "notes", tmp_path / "notes" / "below"):
        with pytest.raises(PipelineUsageError, match="'notes' is not a directory|notes' is not a directory"):
            checked_records(str(path), 0)
    monkeypatch.setenv("PIPEFORGE_RECORDS", str(tmp_path / "notes"))
    with pytest.raises(PipelineUsageError, match="rank 0: PIPEFORGE_RECORDS "):
        checked_records(None, 0)


def misused(rank: int, nproc: int, path: str) -> dict:
    """Each misuse of make_pipeline and step(losses=...) on a real gloo group, its error by label."""
    from pipeforge.tools import demo_models as models
    from pipeforge.tools.generated import load_module

    generated = load_module(path)
    stages = models.build_stages("mlp", nproc)
    errors: dict[str, str] = {}

    def attempt(label, call):
        try:
            call()
            errors[label] = "no error"
        except PipelineUsageError as error:
            errors[label] = str(error)
        except Exception as error:  # noqa: BLE001 - what the test looks for
            errors[label] = f"RAW {type(error).__name__}: {error}"

    build = lambda **kw: generated.make_pipeline({rank: stages[rank]}, **{"loss_fn": models.loss_fn, **kw})  # noqa: E731
    attempt("timeout", lambda: build(timeout=math.inf))
    attempt("device", lambda: build(device="bogus"))
    attempt("group", lambda: build(group="world"))
    attempt("custom", lambda: build(custom_functions=[print]))
    attempt("records", lambda: build(records=5))
    attempt("loss_fn", lambda: build(loss_fn=3))
    pipe = build(timeout=30)
    x, y = models.make_batch(nproc, 4, seed=0)
    batch = (x,) if pipe.holds_first else ()
    target = y if pipe.holds_last else None
    grads = lambda: [p.grad for p in stages[rank].parameters()]  # noqa: E731
    attempt("losses", lambda: pipe.step(*batch, target=target, losses=() if pipe.holds_last else None))
    errors["grads after the refused step"] = str(grads())
    pipe.step(*batch, target=target)  # the next step trains
    errors["grads after a step"] = str(all(g is not None for g in grads()))
    still = lambda o, t: models.loss_fn(o, t).detach()  # noqa: E731
    attempt("detached loss", lambda: generated.make_pipeline({rank: stages[rank]}, loss_fn=still, timeout=30).step(
        *batch, target=target))
    return errors


@pytest.mark.distributed
@pytest.mark.timeout(300)
def test_misused_arguments_are_refused_on_a_real_group_naming_rank_and_argument(tmp_path):
    import pipeforge
    from pipeforge.generator import codegen
    from pipeforge.tools.launch import spawn

    path = str(codegen(pipeforge.load("1f1b", defines={"P": 2, "M": 2}), tmp_path / "gen"))
    outcomes = spawn(misused, 2, path, timeout=30, deadline=150)
    assert all(o.ok for o in outcomes), "\n".join(o.error for o in outcomes if not o.ok)
    for rank, errors in enumerate(o.value for o in outcomes):
        assert not [e for e in errors.values() if e.startswith(("RAW", "no error"))], errors
        assert f"rank {rank}: make_pipeline(timeout=...) must be a finite number" in errors["timeout"]
        assert f"rank {rank}: make_pipeline(device='bogus') is not a device" in errors["device"]
        assert "make_pipeline(group=...) must be a torch.distributed ProcessGroup" in errors["group"]
        assert "custom_functions must be a dict" in errors["custom"]
        assert f"rank {rank}: make_pipeline(records=...) must be a directory path" in errors["records"]
        assert f"rank {rank}: make_pipeline(loss_fn=...) must be callable" in errors["loss_fn"]
        assert "step()/eval() losses= must be a list" in errors["losses"] and "rank 1" in errors["losses"]  # on both
        assert errors["grads after the refused step"] == "[None, None]"  # refused before any compute
        assert errors["grads after a step"] == "True"
        assert "stage 1 on rank 1: loss_fn returned Tensor [] float64 that does not require grad" in errors["detached loss"]
