"""The job of the step-end agreement tests that one rank leaves out (run in spawned gloo processes)."""

from __future__ import annotations

import time


def one_rank_skips_the_agreement(rank: int, nproc: int, job: dict) -> list[str]:
    """Three steps; in the second, rank ``job["late"]`` leaves the step-end agreement out (as a rank that died
    or hung after its program would), then sleeps ``job.get("sleep", 0)`` seconds before the third: what each
    step raised on this rank ('' where it returned). No barrier between steps: the late rank's next greeting
    may time out just as its neighbour arrives (``tests/runtime/test_runtime_greeting.py`` makes it so)."""
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
    for index in range(3):
        pipe.end_agreement = not (index == 1 and rank == job["late"])
        if index == 2 and rank == job["late"]:
            time.sleep(job.get("sleep", 0))
        try:
            pipe.step(*((x,) if pipe.holds_first else ()), target=y if pipe.holds_last else None)
            seen.append("")
        except PipelineError as error:
            seen.append(str(error))
    return seen
