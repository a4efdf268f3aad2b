"""A small GPT on 4 gloo processes: pipeforge's generated modules against torch's schedules, side by side.

    python -m benchmarks.runtime.gpt                       # the six schedules, P=4, M=8, 20 steps
    python -m benchmarks.runtime.gpt --schedules gpipe 1f1b --steps 40
    python -m benchmarks.runtime.gpt --control             # torch against torch: the noise floor now

The model is ``examples/gpt.py``'s GPT (``nn.Embedding``, ``--layers``
``nn.TransformerEncoderLayer`` blocks, an LM head; float32 on CPU), the one
``examples/train_gpt.py`` trains, split into the schedule's stages. For each
schedule, one run of ``--nproc`` processes builds the same stage modules twice
and runs (a) the module ``pipeforge codegen`` writes for the library schedule
and (b) torch's own schedule class with real ``PipelineStage`` objects, steps
alternating between the two (``benchmarks/runtime/_harness.py``). Reported: the medians,
and the median of the per-step ratios pipeforge / torch with its distribution-free
95 % interval (the target: the median at most 1.0, the whole interval below
1.02). The first step's gradients are compared; a relative difference above
1e-4 is a mismatch (exit 1). A schedule whose run fails is reported with its first
error and the others still run. ``--control`` puts a second copy of torch's
schedule in pipeforge's place: the ratios it prints are the spread that the
machine's load alone gives (an A/A test), to read the others against.
"""

from __future__ import annotations

import argparse
import sys
import tempfile

import pipeforge
from benchmarks.runtime import _harness
from benchmarks.runtime._harness import TOLERANCE
from pipeforge.generator import codegen

# library schedule -> torch.distributed.pipelining class
SCHEDULES = {
    "1f1b": "Schedule1F1B",
    "gpipe": "ScheduleGPipe",
    "interleaved-1f1b": "ScheduleInterleaved1F1B",
    "interleaved-zb": "ScheduleInterleavedZeroBubble",
    "zbv": "ScheduleZBVZeroBubble",
    "dualpipev": "ScheduleDualPipeV",
}
V_SCHEDULES = ("ScheduleZBVZeroBubble", "ScheduleDualPipeV")


def check_placement(info, class_name: str, ranks: int) -> None:
    """pipeforge's placement must be the one torch's class assumes, or the comparison means nothing."""
    from torch.distributed.pipelining._utils import generate_stage_to_rank_mapping

    style = "v" if class_name in V_SCHEDULES else "loop"
    theirs = generate_stage_to_rank_mapping(ranks, info.stages, style=style)
    if tuple(theirs[s] for s in range(info.stages)) != info.placements[0]:
        raise RuntimeError(f"{info.name}: placement {info.placements[0]} differs from torch's {theirs}")


def bench_worker(rank: int, nproc: int, config: dict) -> dict:
    import copy

    gpt = _harness.example_gpt()
    GPTConfig, gpt_stages, lm_loss, token_batches = gpt.GPTConfig, gpt.gpt_stages, gpt.lm_loss, gpt.token_batches

    from pipeforge.tools.generated import load_module

    generated = load_module(config["module"])
    info = generated.SCHEDULE
    check_placement(info, config["torch_class"], nproc)
    model = GPTConfig(**config["model"])
    pieces = gpt_stages(model, info.stages, seed=0)
    theirs = {s: pieces[s] for s in generated.stages_of_rank(rank)}
    ours = {s: copy.deepcopy(m) for s, m in theirs.items()}
    pipe = generated.make_pipeline(ours, loss_fn=lm_loss, timeout=config["timeout"])
    reference = _harness.torch_schedule(config["torch_class"], theirs, info.stages, info.microbatches, lm_loss)
    if config["control"]:  # torch in pipeforge's place (A/A)
        pipe_torch = _harness.torch_schedule(config["torch_class"], ours, info.stages, info.microbatches, lm_loss)
    tokens, target = next(token_batches(model, config["rows"]))
    args = (tokens,) if pipe.holds_first else ()
    label = target if pipe.holds_last else None
    first = pipe_torch if config["control"] else pipe
    return _harness.measure_pair(
        lambda: first.step(*args, target=label), lambda: reference.step(*args, target=label),
        steps=config["steps"], warmup=config["warmup"], modules=(*ours.values(), *theirs.values()),
        compare=lambda: _harness.max_relative_difference(_harness.gradients(ours), _harness.gradients(theirs)))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--schedules", nargs="+", choices=sorted(SCHEDULES), default=list(SCHEDULES))
    parser.add_argument("--nproc", type=int, default=4)
    parser.add_argument("--microbatches", type=int, default=8)
    parser.add_argument("--rows", type=int, default=16, help="sequences per batch (split into microbatches)")
    parser.add_argument("--seq", type=int, default=32)
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--vocab", type=int, default=128)
    parser.add_argument("--steps", type=int, default=20, help="measured steps (after --warmup)")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=120.0)
    parser.add_argument("--control", action="store_true",
                        help="torch against torch (A/A): the ratios the machine's load alone gives")
    args = parser.parse_args(argv)
    model = {"vocab": args.vocab, "seq": args.seq, "width": args.width, "heads": args.heads, "layers": args.layers}
    print(f"GPT {model}, rows {args.rows}, P={args.nproc}, M={args.microbatches}, float32, gloo on CPU, "
          f"median of {args.steps} steps; {_harness.load_average()}"
          + ("\nCONTROL: torch's schedule in both columns (A/A)" if args.control else ""))
    print(f"{'schedule':<17} {'torch class':<30} {'pipeforge ms':>12} {'torch ms':>9} {'ratio':>6} "
          f"{'95% interval':>13} {'met':>4} {'cpu ratio':>9} {'main ratio':>10} {'main 95%':>13} {'grad diff':>9}")
    failed = False
    with tempfile.TemporaryDirectory(prefix="pipeforge-bench-gpt-") as out_dir:
        for name in args.schedules:
            schedule = pipeforge.load(name, defines={"P": args.nproc, "M": args.microbatches})
            module = str(codegen(schedule, out_dir))  # one module per schedule name
            config = {"module": module, "torch_class": SCHEDULES[name], "model": model, "rows": args.rows,
                      "steps": args.steps, "warmup": args.warmup, "timeout": args.timeout, "control": args.control}
            outcomes, error = _harness.run_ranks(bench_worker, args.nproc, config, timeout=args.timeout,
                                                 deadline=args.timeout * 6)
            if error:
                print(f"{name:<17} {SCHEDULES[name]:<30} failed: {error}", flush=True)
                failed = True
                continue
            row = _harness.summarize([o.value for o in outcomes])
            low, high = row["ratio_interval"]
            met = "yes" if row["ratio"] <= 1.0 and high < 1.02 else "no"  # issue 23: median <= 1, interval < 1.02
            main_low, main_high = row["main_interval"]
            print(f"{name:<17} {SCHEDULES[name]:<30} {row['pipeforge'] * 1e3:>12.1f} {row['torch'] * 1e3:>9.1f} "
                  f"{row['ratio']:>6.2f} {f'[{low:.2f}, {high:.2f}]':>13} {met:>4} {row['cpu_ratio']:>9.2f} "
                  f"{row['main_ratio']:>10.2f} {f'[{main_low:.2f}, {main_high:.2f}]':>13} {row['mismatch']:>9.1e}",
                  flush=True)
            failed |= row["mismatch"] > TOLERANCE
    print(_harness.legend() + "; 95% interval: the distribution-free interval of the median per-step ratio; "
          "met: the median at most 1.0 and the whole interval below 1.02")
    print(f"after: {_harness.load_average()}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
