"""What records cost: a generated pipeline's step with ``records=DIR`` against the same pipeline without.

    python -m benchmarks.runtime.records [--nproc 2] [--microbatches 16] [--steps 20]

Two pipelines of the same generated 1F1B module over the same tiny stages (width 4,
where the runtime's own work is most of a step) on gloo: one with
``make_pipeline(records=DIR, timeout=...)`` (every action told to the recorder, a
record written at the end of every step), one without (the same timeout). Steps
alternate, each after a barrier (``_harness.measure_pair``: the "torch" columns are
the pipeline without records). Prints the medians and the ratios with records /
without, wall and CPU; exits 1 if the first step's gradients differ.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import pipeforge
from benchmarks.runtime import _harness
from benchmarks.runtime.mlp import build_stages
from pipeforge.generator import codegen


def worker(rank: int, nproc: int, config: dict) -> dict:
    import copy

    import torch

    from pipeforge.tools.generated import load_module

    generated = load_module(config["module"])
    info = generated.SCHEDULE
    held = sorted(generated.stages_of_rank(rank))
    full = build_stages(info.stages, 4, seed=0)
    plain = {s: full[s] for s in held}
    recorded = {s: copy.deepcopy(plain[s]) for s in held}
    with_records = generated.make_pipeline(recorded, loss_fn=_harness.mse_loss, timeout=config["timeout"],
                                           records=config["records"])
    without = generated.make_pipeline(plain, loss_fn=_harness.mse_loss, timeout=config["timeout"])
    x = torch.randn(config["rows"], 4, generator=torch.Generator().manual_seed(1))
    y = torch.randn(config["rows"], 4, generator=torch.Generator().manual_seed(2))
    args = (x,) if with_records.holds_first else ()
    target = y if with_records.holds_last else None
    record = _harness.measure_pair(
        lambda: with_records.step(*args, target=target), lambda: without.step(*args, target=target),
        steps=config["steps"], warmup=2, modules=(*recorded.values(), *plain.values()),
        compare=lambda: _harness.max_relative_difference(_harness.gradients(recorded), _harness.gradients(plain)))
    return _harness.gather_on_rank0(rank, nproc, {"records": record})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--microbatches", type=int, default=16)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--timeout", type=float, default=60.0)
    args = parser.parse_args(argv)
    print(_harness.load_average())
    with tempfile.TemporaryDirectory(prefix="pipeforge-records-") as out:
        schedule = pipeforge.load("1f1b", defines={"P": args.nproc, "M": args.microbatches})
        config = {"module": str(codegen(schedule, Path(out) / "gen")), "records": str(Path(out) / "records"),
                  "rows": 2 * args.microbatches, "steps": args.steps, "timeout": args.timeout}
        outcomes, error = _harness.run_ranks(worker, args.nproc, config, timeout=args.timeout,
                                             deadline=args.timeout * 4 + 60)
    if error:
        print(error, file=sys.stderr)
        return 1
    row = outcomes[0].value["records"]
    print(f"1F1B P={args.nproc} M={args.microbatches}, tiny stages: with records {row['pipeforge'] * 1e3:.2f} ms, "
          f"without {row['torch'] * 1e3:.2f} ms a step (slowest rank, median); with / without: wall "
          f"{row['ratio']:.3f}, CPU {row['cpu_ratio']:.3f}, schedule thread {row['main_ratio']:.3f}; "
          f"gradient difference {row['mismatch']:.1e}")
    return 1 if row["mismatch"] > _harness.TOLERANCE else 0


if __name__ == "__main__":
    raise SystemExit(main())
