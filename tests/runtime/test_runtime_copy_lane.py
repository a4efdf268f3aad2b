"""OFFLOAD and RELOAD's copy lane (``runtime/copy_lane.py``): one code path for the CPU and CUDA lanes.

On the CPU the round trip F, OFFLOAD, RELOAD, B gives the plain backward's gradients bit for bit and
counts the saved bytes off the device while away. The CUDA lane cannot run here (no GPU on this
machine): its logic runs on CPU tensors against a recording stand-in for ``torch.cuda``'s streams and
events (the order of waits, records and events is what is checked, not a GPU); with a GPU present the
same round trip runs on it for real.
"""

from __future__ import annotations

import copy
from contextlib import contextmanager

import pytest
import torch

from pipeforge.runtime.copy_lane import HostCopies, StreamCopies, copy_lane, move
from pipeforge.runtime.saved import SavedActivations
from pipeforge.runtime.stage import StageRunner
from tests.zoo import models as zoo

KEY = (1, 0, 0)


def round_trip(device: torch.device, lane=None) -> tuple[list[torch.Tensor], list[torch.Tensor], SavedActivations]:
    """One microbatch of a GPT stage: the plain F and B, and F, OFFLOAD, RELOAD, B; both runs' gradients."""
    stage = zoo.build("gpt-dropout", 2)[1].eval().to(device)  # eval: no dropout, so both runs draw nothing
    _, targets, _ = zoo.batch("gpt-dropout", 2, 0)
    x = torch.randn(2, zoo.SEQ, zoo.WIDTH, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    x, targets = x.to(device), targets.to(device)
    grads = []
    for offloaded in (False, True):
        module = copy.deepcopy(stage)
        runner = StageRunner(module, 1, 0, False, True, zoo.loss_fn)
        saved = SavedActivations(frozenset(), frozenset({KEY}) if offloaded else frozenset(), device, count=True)
        if lane is not None:
            saved.lane = lane
        saved.forward(runner, 0, (x,), targets, True, {})
        if offloaded:
            held = saved.counter.held
            saved.offload(runner, 0)
            assert saved.counter.held == 0 < held
            saved.reload(runner, 0)
            assert saved.counter.held == held
        saved.wait(KEY)
        runner.backward(0, None)
        saved.backward_done(KEY)
        grads.append([p.grad.clone() for p in module.parameters()])
    return grads[0], grads[1], saved


def test_the_cpu_lane_round_trip_is_exact():
    assert isinstance(copy_lane(torch.device("cpu")), HostCopies) and isinstance(copy_lane(None), HostCopies)
    plain, offloaded, _ = round_trip(torch.device("cpu"))
    assert all(torch.equal(a, b) for a, b in zip(plain, offloaded))


class RecordingCuda:
    """Stands in for ``torch.cuda`` (no GPU here): streams and events that log what the lane asks of them."""

    def __init__(self):
        self.log: list[str] = []
        self.compute = self.Stream(self, "compute")

    def Stream(self, owner_or_device, name: str = "side"):  # noqa: N802 (torch.cuda.Stream)
        owner = owner_or_device if isinstance(owner_or_device, RecordingCuda) else self
        return _Stream(owner, name)

    def Event(self):  # noqa: N802 (torch.cuda.Event)
        self.log.append("event")
        return _Event(self, len([e for e in self.log if e == "event"]))

    def current_stream(self, device):
        return self.compute

    @contextmanager
    def stream(self, stream):
        self.log.append(f"enter {stream.name}")
        yield
        self.log.append(f"leave {stream.name}")


class _Stream:
    def __init__(self, owner: RecordingCuda, name: str):
        self.owner, self.name = owner, name

    def wait_stream(self, other):
        self.owner.log.append(f"{self.name} waits {other.name}")

    def wait_event(self, event):
        self.owner.log.append(f"{self.name} waits event {event.number}")


class _Event:
    def __init__(self, owner: RecordingCuda, number: int):
        self.owner, self.number = owner, number

    def record(self, stream):
        self.owner.log.append(f"event {self.number} on {stream.name}")

    def synchronize(self):
        self.owner.log.append(f"host waits event {self.number}")


def test_the_cuda_lanes_logic_against_a_recording_stand_in():
    cuda = RecordingCuda()
    recorded: list[tuple[str, str]] = []

    class Lane(StreamCopies):
        @staticmethod
        def record(tensor, stream):
            recorded.append((tensor.device.type, stream.name))

    lane = Lane(torch.device("cuda"), cuda=cuda)
    plain, offloaded, saved = round_trip(torch.device("cpu"), lane)
    assert all(torch.equal(a, b) for a, b in zip(plain, offloaded))
    # each transfer: the side stream waits for the compute stream, copies on it, then an event after the copies;
    # the backward's compute stream waits for the reload's event
    assert cuda.log == ["side waits compute", "enter side", "leave side", "event", "event 1 on side",
                        "side waits compute", "enter side", "leave side", "event", "event 2 on side",
                        "compute waits event 2"]
    sources = len(recorded) // 4  # two transfers, each recording its sources (side) and its copies (compute)
    assert recorded == ([("cpu", "side")] * sources + [("cpu", "compute")] * sources) * 2 and sources > 0
    assert not lane.events and not saved.holders


def test_an_addition_waits_on_the_host_for_the_offload_the_rule_names_and_only_then():
    """``wait_offload``: on CUDA the host waits for that OFFLOAD's event (not a reload's), once; on the CPU
    the copy was made at once and there is nothing to wait for."""
    cuda = RecordingCuda()
    lane = StreamCopies(torch.device("cuda"), cuda=cuda)
    lane.begin()
    lane.finish(KEY, [], [], away=True)
    lane.finish((1, 1, 0), [], [], away=False)  # a reload: the backward waits for it, no addition does
    lane.wait_offload((1, 1, 0))
    lane.wait_offload(KEY)
    lane.wait_offload(KEY)
    assert [line for line in cuda.log if line.startswith("host")] == ["host waits event 1"]
    HostCopies().wait_offload(KEY)


def test_codegen_writes_each_wait_the_copy_lane_rule_names(tmp_path):
    """F F OFFLOAD0 F OFFLOAD1 RELOAD0 B RELOAD1 B B on rank 0 at limit 2: F2 waits for OFFLOAD0, each
    RELOAD for OFFLOAD1 (2 held in program order: neither transfer may be in flight); at limit 3 F2 does
    not wait (3 with OFFLOAD0 in flight) and the RELOADs wait for OFFLOAD0 only; with no limit nothing
    waits."""
    import pipeforge
    from pipeforge.generator import codegen
    from pipeforge.tools.generated import load_module

    text = """schedule off(P = 2, M = 3) {
        ranks P
        stages P placement loop
        microbatches M
        memory { limit = LIMIT }
        rank 0 { 0F0 0F1 0OFFLOAD0 0F2 0OFFLOAD1 0RELOAD0 0B0 0RELOAD1 0B1 0B2 }
        rank 1 { 1F0 1B0 1F1 1B1 1F2 1B2 }
    }
    """
    found = {}
    for limit in ("2", "3", None):
        source = text.replace("LIMIT", limit) if limit else text.replace("        memory { limit = LIMIT }\n", "")
        module = load_module(str(codegen(pipeforge.loads(source), tmp_path / f"limit{limit}")))
        found[limit] = module.SCHEDULE.offload_waits
    assert found["2"] == (((0, "F", 2, 0), (0, 0, 0)), ((0, "RELOAD", 0, 0), (0, 1, 0)),
                          ((0, "RELOAD", 1, 0), (0, 1, 0)))
    assert found["3"] == (((0, "RELOAD", 0, 0), (0, 0, 0)), ((0, "RELOAD", 1, 0), (0, 0, 0)))
    assert found[None] == ()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no GPU on this machine: the CUDA lane's logic is "
                    "checked above against a stand-in")
def test_the_cuda_lane_round_trip_on_a_gpu():
    device = torch.device("cuda", torch.cuda.current_device())
    assert isinstance(copy_lane(device), StreamCopies)
    plain, offloaded, _ = round_trip(device)
    assert all(torch.equal(a, b) for a, b in zip(plain, offloaded))


def test_views_of_one_storage_come_back_as_views_of_one_copy():
    base = torch.arange(40, dtype=torch.float64).reshape(5, 8)
    tensors = [base[1:], base[1:].t(), base[2:4, ::2], torch.zeros(0), torch.arange(3)]
    moved, sources, copies = move(HostCopies(), tensors, torch.device("cpu"))
    assert all(torch.equal(a, b) and a.shape == b.shape and a.stride() == b.stride() for a, b in zip(tensors, moved))
    assert len(copies) == 2 and copies[0].numel() == 4 * 8 * 8  # rows 1..4 of the base: the bytes they reach
    assert len({t.untyped_storage().data_ptr() for t in moved[:3]}) == 1
    assert all(t.untyped_storage().data_ptr() != base.untyped_storage().data_ptr() for t in moved[:3])


def test_tensors_that_are_no_plain_views_are_copied_as_they_are():
    z = torch.randn(3, 2, dtype=torch.complex128)
    sparse = torch.eye(3, dtype=torch.float64).to_sparse()
    tensors = [z.conj(), z, sparse]
    moved, _, copies = move(HostCopies(), tensors, torch.device("cpu"))
    assert torch.equal(moved[0].resolve_conj(), z.conj().resolve_conj()) and torch.equal(moved[1], z)
    assert torch.equal(moved[2].to_dense(), sparse.to_dense()) and len(copies) == 3


@pytest.mark.distributed
@pytest.mark.timeout(300)
def test_a_schedule_whose_additions_wait_for_offloads_trains_as_the_unpipelined_model(tmp_path, capsys):
    """The limit-2 schedule above, generated (so its F2 and RELOADs carry their waits) and run on 2 gloo
    ranks by ``pipeforge run``: the same losses and gradients as the model unpipelined."""
    import json

    from pipeforge.cli import main

    path = tmp_path / "off.pipe"
    path.write_text("""schedule off(P = 2, M = 3) {
        ranks P
        stages P placement loop
        microbatches M
        memory { limit = 2 }
        rank 0 { 0F0 0F1 0OFFLOAD0 0F2 0OFFLOAD1 0RELOAD0 0B0 0RELOAD1 0B1 0B2 }
        rank 1 { 1F0 1B0 1F1 1B1 1F2 1B2 }
    }
    """)
    assert main(["run", str(path), "--nproc", "2", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["match"] is True


def test_codegen_waits_for_the_last_offload_of_an_overlap_step(tmp_path):
    """At limit 3, F3 holds 4 with (OFFLOAD0;OFFLOAD1) in flight: the rank waits for OFFLOAD1's copy, the
    step's last (``semantics.waited_offload``), as simulate times it."""
    import pipeforge
    from pipeforge.generator import codegen
    from pipeforge.tools.generated import load_module

    text = """schedule two(P = 2, M = 4) {
        ranks P
        stages P placement loop
        microbatches M
        memory { limit = 3 }
        rank 0 { 0F0 0F1 0F2 (0OFFLOAD0;0OFFLOAD1) 0F3 0RELOAD0 0B0 0RELOAD1 0B1 0B2 0B3 }
        rank 1 { 1F0 1B0 1F1 1B1 1F2 1B2 1F3 1B3 }
    }
    """
    module = load_module(str(codegen(pipeforge.loads(text), tmp_path / "two")))
    assert ((0, "F", 3, 0), (0, 1, 0)) in module.SCHEDULE.offload_waits
