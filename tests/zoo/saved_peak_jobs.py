"""Each rank's measured peak bytes of saved activations against ``simulate``'s prediction from a profile.

``measure(ranks, microbatches, out_dir)`` profiles ``tests/zoo/gpt_model.py`` (the GPT with dropout; ``model``:
``gpt`` for the GPT without, whose stages hold more from I to W than their activation) with
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
MODELS = {"gpt-dropout": MODEL, "gpt": str(Path(__file__).with_name("gpt_plain_model.py"))}


class Row(NamedTuple):
    schedule: str
    how: str
    rank: int
    measured: int  # bytes, Pipeline.saved_peak
    predicted: float  # bytes, simulate's peak_memory[rank] * M_B of the cost file

    @property
    def ratio(self) -> float:
        return self.measured / self.predicted


def profile(stages: int, microbatches: int, out: Path, model: str = MODEL) -> Path:
    """A cost file of the GPT cut into ``stages``, from ``pipeforge profile`` (one measured step: the bytes
    come from its first, uncounted step; the times are not used here)."""
    path = out / f"costs-{stages}.json"
    command = [sys.executable, "-m", "pipeforge", "profile", model, "--stages", str(stages), "--microbatches",
               str(microbatches), "--steps", "1", "--warmup", "0", "-o", str(path)]
    subprocess.run(command, check=True, capture_output=True, timeout=300)
    return path


def measure(ranks: int, microbatches: int, out: Path, model: str = "gpt-dropout",
            schedules: tuple[str, ...] = SCHEDULES, how: tuple[str, ...] = HOW) -> list[Row]:
    import pipeforge
    from pipeforge.generator import codegen
    from pipeforge.passes.recompute import offload, recompute
    from pipeforge.sim.costfile import read_cost_file, with_cost_file
    from pipeforge.tools.launch import spawn

    transforms = {"plain": lambda s: s, "recompute": recompute, "offload": offload}
    built = {(name, way): transforms[way](pipeforge.load(name, defines={"P": ranks, "M": microbatches}))
             for name in schedules for way in how}
    costs = {stages: profile(stages, microbatches, out, MODELS[model])
             for stages in sorted({s.stages for s in built.values()})}
    paths = {f"{name} {way}": str(codegen(s, out / f"{name}-{way}")) for (name, way), s in built.items()}
    outcomes = spawn("tests.zoo.saved_peak_jobs:run", ranks, {"model": MODELS[model], "paths": paths},
                     timeout=60, deadline=600)
    failed = [o.error for o in outcomes if not o.ok]
    if failed:
        raise RuntimeError("\n".join(failed))
    rows = []
    for (name, way), schedule in built.items():
        path = costs[schedule.stages]
        unit = read_cost_file(path).activation_bytes
        peaks = pipeforge.simulate(with_cost_file(schedule, path)).peak_memory
        rows += [Row(name, way, rank, outcome.value[f"{name} {way}"], peaks[rank] * unit)
                 for rank, outcome in enumerate(outcomes)]
    return rows


def run(rank: int, nproc: int, job: dict, steps: int = 2) -> dict[str, int]:
    """The spawned worker: per generated module (``job["paths"]``: label -> path), this rank's largest
    ``saved_peak`` on the model file ``job["model"]``."""
    import runpy

    from pipeforge.tools.generated import load_module
    from tests.zoo import models as zoo

    pipeforge_model = runpy.run_path(job["model"])["pipeforge_model"]
    found = {}
    for label, path in job["paths"].items():
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
