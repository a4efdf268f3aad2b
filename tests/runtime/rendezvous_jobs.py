"""The jobs of the rendezvous tests: steps where one rank comes late (run in spawned gloo processes)."""

from __future__ import annotations

import time


def late_steps(rank: int, nproc: int, job: dict) -> list[tuple[str, float]]:
    """``len(job["sleeps"])`` steps of the demo MLP; before step ``i`` rank ``job["late"]`` sleeps
    ``job["sleeps"][i]`` seconds (no barrier between steps). What each step raised on this rank ('' where it
    returned) and the seconds it took."""
    from pipeforge.runtime import PipelineError
    from pipeforge.tools import demo_models as models
    from pipeforge.tools.generated import load_module

    generated = load_module(job["path"])
    info = generated.SCHEDULE
    full = models.build_stages("mlp", info.stages, seed=0)
    pipe = generated.make_pipeline({s: full[s] for s in info.stages_of(rank)}, loss_fn=models.loss_fn,
                                   timeout=job["wait"])
    x, y = models.make_batch(info.stages, 8, seed=0)
    seen = []
    for sleep in job["sleeps"]:
        if rank == job["late"]:
            time.sleep(sleep)
        started = time.monotonic()
        try:
            pipe.step(*((x,) if pipe.holds_first else ()), target=y if pipe.holds_last else None)
            seen.append(("", time.monotonic() - started))
        except PipelineError as error:
            seen.append((str(error), time.monotonic() - started))
    return seen
