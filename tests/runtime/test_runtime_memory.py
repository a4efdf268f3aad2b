"""Trust in the simulator: the activations the runtime holds peak where ``simulate`` says they do.

Every library schedule runs one real training step on gloo processes; each rank
counts the microbatch activations it holds as its actions run
(``pipeforge.runtime.memory``: F holds one, I or B releases what waits for the
input gradient, W or B what waits for the weight gradient). The peak per rank
must equal ``simulate``'s peak memory for the same schedule under the memory
models ``weights`` = 0 (activations awaiting I/B), 1 (awaiting W/B) and the
default 0.5.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest

import pipeforge
from pipeforge.generator import codegen
from pipeforge.ir import MemorySpec
from pipeforge.library import names
from pipeforge.tools.launch import spawn
from pipeforge.runtime.memory import WEIGHTS, ActivationCount
from pipeforge.sim import simulate

SIZES = {2: 4, 4: 8}  # ranks -> microbatches


def library_schedules(ranks: int) -> list:
    schedules = []
    for name in names():
        try:
            schedules.append(pipeforge.load(name, defines={"P": ranks, "M": SIZES[ranks]}))
        except pipeforge.errors.PipeforgeError:  # a schedule that needs other sizes
            continue
    return schedules


def peaks_of_every_module(rank: int, nproc: int, paths: list[str]) -> list[tuple[float, ...]]:
    """One training step of each module with the mlp model; this rank's peak for each weights value."""
    from pipeforge.tools import demo_models as models
    from pipeforge.tools.generated import load_module

    found = []
    for path in paths:
        generated = load_module(path)
        info = generated.SCHEDULE
        stages = models.build_stages("mlp", info.stages)
        pipe = generated.make_pipeline({s: stages[s] for s in generated.stages_of_rank(rank)},
                                       loss_fn=models.loss_fn, timeout=60)
        x, y = models.make_batch(info.stages, 2 * info.microbatches, seed=0)
        pipe.step(*((x,) if pipe.holds_first else ()), target=y if pipe.holds_last else None)
        found.append(tuple(pipe.activations.peak(w) for w in WEIGHTS))
    return found


@pytest.mark.distributed
@pytest.mark.timeout(300)
@pytest.mark.parametrize("ranks", sorted(SIZES))
def test_runtime_peak_activations_equal_simulated_peak_memory(ranks):
    schedules = library_schedules(ranks)
    assert len(schedules) >= 10
    with tempfile.TemporaryDirectory() as out_dir:
        paths = [str(codegen(s, Path(out_dir), name=f"m{i}")) for i, s in enumerate(schedules)]
        outcomes = spawn(peaks_of_every_module, ranks, paths, timeout=60, deadline=240)
    assert all(o.ok for o in outcomes), "\n".join(o.error for o in outcomes if not o.ok)
    mismatches = []
    for index, schedule in enumerate(schedules):
        for w_index, weights in enumerate(WEIGHTS):
            simulated = simulate(schedule, memory=MemorySpec(weights=weights)).peak_memory
            measured = tuple(outcomes[rank].value[index][w_index] for rank in range(ranks))
            if measured != pytest.approx(simulated, abs=1e-9):
                mismatches.append(f"{schedule.name} weights={weights}: runtime {measured}, simulate {simulated}")
    assert not mismatches, "\n".join(mismatches)


def test_counting_follows_the_memory_model():
    count = ActivationCount()
    for _ in range(3):
        count.forward()
    count.backward_input()  # 2 await I, 3 await W
    count.forward()  # 3 and 4: the peak for every weights
    count.backward()
    count.backward_weight()
    assert (count.awaiting_input, count.awaiting_weight) == (2, 2)
    assert [count.peak(w) for w in WEIGHTS] == [3.0, 3.5, 4.0]
    with pytest.raises(ValueError, match="weights"):
        count.peak(0.25)


def test_an_overlap_step_releases_after_it_adds():
    count = ActivationCount()
    count.forward()
    with count.overlap():  # (1B0;0F1) run backward first, yet the step holds both
        count.backward()
        count.forward()
    assert count.peak(1.0) == 2.0 and count.awaiting_weight == 1
    count.backward()
    count.forward()  # outside an overlap the release comes first
    assert count.peak(1.0) == 2.0
