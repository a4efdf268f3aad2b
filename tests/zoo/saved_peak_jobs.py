"""Each rank's measured peak bytes of saved activations against ``simulate``'s prediction from a profile.

``measure(ranks, microbatches, out_dir)`` profiles ``tests/zoo/gpt_model.py`` (the GPT with dropout) with
``pipeforge profile`` for the stage counts the schedules need, generates 1F1B, ZB-H1, interleaved 1F1B
and ZBV as written, with every (stage, microbatch) recomputed and with every one offloaded, runs each on
``ranks`` gloo processes with ``count_saved`` (``run``, the spawned worker: the largest
``Pipeline.saved_peak`` of two steps) and returns one ``Row`` per schedule and rank: the measured bytes
and ``simulate``'s peak on the cost file times its M_B in bytes. Used by
``tests/runtime/test_runtime_saved_peak.py`` and ``benchmarks/runtime/memory.py``.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import NamedTuple

SCHEDULES = ("1f1b", "zb-h1", "interleaved-1f1b", "zbv")
HOW = ("plain", "recompute", "offload")
MODEL = str(Path(__file__).with_name("gpt_model.py"))


class Row(NamedTuple):
    schedule: str
    how: str
    rank: int
    measured: int  # bytes, Pipeline.saved_peak
    predicted: float  # bytes, simulate's peak_memory[rank] * M_B of the cost file

    @property
    def ratio(self) -> float:
        return self.measured / self.predicted


def profile(stages: int, microbatches: int, out: Path) -> Path:
    """A cost file of the GPT cut into ``stages``, from ``pipeforge profile`` (one measured step: the bytes
    come from its first, uncounted step; the times are not used here)."""
    path = out / f"costs-{stages}.json"
    command = [sys.executable, "-m", "pipeforge", "profile", MODEL, "--stages", str(stages), "--microbatches",
               str(microbatches), "--steps", "1", "--warmup", "0", "-o", str(path)]
    subprocess.run(command, check=True, capture_output=True, timeout=300)
    return path


def measure(ranks: int, microbatches: int, out: Path) -> list[Row]:
    import pipeforge
    from pipeforge.generator import codegen
    from pipeforge.passes.recompute import offload, recompute
    from pipeforge.sim.costfile import read_cost_file, with_cost_file
    from pipeforge.tools.launch import spawn

    transforms = {"plain": lambda s: s, "recompute": recompute, "offload": offload}
    schedules = {(name, how): transforms[how](pipeforge.load(name, defines={"P": ranks, "M": microbatches}))
                 for name in SCHEDULES for how in HOW}
    costs = {stages: profile(stages, microbatches, out) for stages in sorted({s.stages for s in schedules.values()})}
    paths = {f"{name} {how}": str(codegen(s, out / f"{name}-{how}")) for (name, how), s in schedules.items()}
    outcomes = spawn("tests.zoo.saved_peak_jobs:run", ranks, paths, timeout=60, deadline=600)
    failed = [o.error for o in outcomes if not o.ok]
    if failed:
        raise RuntimeError("\n".join(failed))
    rows = []
    for (name, how), schedule in schedules.items():
        path = costs[schedule.stages]
        unit = read_cost_file(path).activation_bytes
        peaks = pipeforge.simulate(with_cost_file(schedule, path)).peak_memory
        rows += [Row(name, how, rank, outcome.value[f"{name} {how}"], peaks[rank] * unit)
                 for rank, outcome in enumerate(outcomes)]
    return rows


def run(rank: int, nproc: int, paths: dict[str, str], steps: int = 2) -> dict[str, int]:
    """The spawned worker: per generated module (label -> path), this rank's largest ``saved_peak``."""
    from pipeforge.tools.generated import load_module
    from tests.zoo import models as zoo
    from tests.zoo.gpt_model import pipeforge_model

    found = {}
    for label, path in paths.items():
        generated = load_module(path)
        info = generated.SCHEDULE
        model = pipeforge_model(info.stages)
        mine = {s: model["modules"][s] for s in info.stages_of(rank)}
        pipe = generated.make_pipeline(mine, loss_fn=zoo.loss_fn, timeout=60, rng_seed=0)
        pipe.count_saved = True
        peaks = []
        for _ in range(steps):
            pipe.step(*((model["batch"],) if pipe.holds_first else ()),
                      target=model["target"] if pipe.holds_last else None, return_outputs=False)
            peaks.append(pipe.saved_peak)
            for module in mine.values():
                module.zero_grad(set_to_none=True)
        found[label] = max(peaks)
    return found
