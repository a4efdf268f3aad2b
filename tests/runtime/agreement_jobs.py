"""The job of the step-end agreement tests that one rank leaves out (run in spawned gloo processes)."""

from __future__ import annotations

import time

from pipeforge.tools import demo_models as models
from tests.demo_jobs import demo_pipeline, timed_step


def one_rank_skips_the_agreement(rank: int, nproc: int, job: dict) -> list[str]:
    """Three steps; in the second, rank ``job["late"]`` leaves the step-end agreement out (as a rank that died
    or hung after its program would), then sleeps ``job.get("sleep", 0)`` seconds before the third: what each
    step raised on this rank ('' where it returned). No barrier between steps: the late rank's next greeting
    may time out just as its neighbour arrives (``tests/runtime/test_runtime_greeting.py`` makes it so)."""
    pipe = demo_pipeline(job, rank)
    x, y = models.make_batch(pipe.info.stages, 8, seed=0)
    seen = []
    for index in range(3):
        pipe.end_agreement = not (index == 1 and rank == job["late"])
        if index == 2 and rank == job["late"]:
            time.sleep(job.get("sleep", 0))
        seen.append(timed_step(pipe, x, y)[0])
    return seen
