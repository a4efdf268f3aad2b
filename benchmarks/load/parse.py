"""Parsing and elaborating .pipe beside torch building and reading the same schedule.

The schedule: interleaved 1F1B at 32 ranks x 128 microbatches x 2 stages per rank
(16,384 compute actions), written parametrically in benchmarks/load/interleaved_1f1b.pipe.

- pipeforge: lark parse + compile (cold, grammar loaded), elaborate again with the
  compiled closures (warm), load the canonical explicit form (`pipeforge fmt`
  output, every step a torch token), and read the 32-row torch CSV
  (pipeforge.interop.torch_csv);
- torch: ScheduleInterleaved1F1B computing its pipeline_order, and torch's own
  _load_csv reading the same CSV (the base PipelineScheduleMulti path: parse the
  cells and validate; the runtime subclass would also lower it).

    python -m benchmarks.load.parse [--repeat 5] [-D P=32 -D M=128 -D V=2]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from torch.distributed.pipelining import schedules as torch_schedules

from pipeforge.ir import parse_step
from pipeforge.lang import compile_text, load_text
from pipeforge.lang.elaborate import elaborate
from pipeforge.lang.lark_parser import parser
from pipeforge.lang.printer import print_schedule
from tests.torch_stages import build_torch_schedule, dump_torch_csv

ROOT = Path(__file__).resolve().parents[2]

PROGRAM = Path(__file__).parent / "interleaved_1f1b.pipe"


def best_of(repeat: int, run: Callable[[], object]) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return min(times)


def pipeforge_times(text: str, defines: dict[str, int], repeat: int) -> dict[str, float]:
    parser.cache_clear()
    start = time.perf_counter()
    parser()
    grammar = time.perf_counter() - start
    counter = iter(range(10**9))
    # a distinct file name defeats the compile cache, so each run parses and compiles afresh
    cold = best_of(repeat, lambda: load_text(text, defines=defines, filename=f"bench{next(counter)}.pipe"))
    compiled = compile_text(text, "bench.pipe")[0]
    warm = best_of(repeat, lambda: elaborate(compiled, defines))
    canonical = print_schedule(elaborate(compiled, defines))
    explicit = best_of(repeat, lambda: load_text(canonical, filename=f"canonical{next(counter)}.pipe"))
    return {"grammar": grammar, "cold": cold, "warm": warm, "explicit": explicit}


def torch_build_time(ranks: int, microbatches: int, per_rank: int, repeat: int) -> float:
    return best_of(repeat, lambda: build_torch_schedule("ScheduleInterleaved1F1B", ranks, microbatches, per_rank))


def csv_times(ranks: int, microbatches: int, per_rank: int, repeat: int) -> dict[str, float | None]:
    with tempfile.TemporaryDirectory() as folder:
        path = dump_torch_csv("ScheduleInterleaved1F1B", ranks, microbatches, per_rank, Path(folder) / "order.csv")
        schedule = build_torch_schedule("ScheduleInterleaved1F1B", ranks, microbatches, per_rank)
        torch_time = best_of(repeat, lambda: torch_schedules.PipelineScheduleMulti._load_csv(schedule, str(path)))
        try:
            from pipeforge.interop.torch_csv import read_csv
        except ImportError:
            return {"torch": torch_time, "ours": None}
        ours = best_of(repeat, lambda: read_csv(path))
    return {"torch": torch_time, "ours": ours}


def same_order_as_torch(text: str, defines: dict[str, int], ranks: int, microbatches: int, per_rank: int) -> bool:
    schedule = load_text(text, defines=defines, filename="check.pipe")
    order = build_torch_schedule("ScheduleInterleaved1F1B", ranks, microbatches, per_rank).pipeline_order
    return all([parse_step(str(a)) for a in order[r] if a is not None] == list(schedule.programs[r])
               for r in range(ranks))


def main() -> None:
    options = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    options.add_argument("--repeat", type=int, default=5)
    options.add_argument("-D", dest="defines", action="append", default=[], metavar="NAME=VALUE")
    args = options.parse_args()
    defines = {"P": 32, "M": 128, "V": 2} | {k: int(v) for k, v in (d.split("=") for d in args.defines)}
    ranks, microbatches, per_rank = defines["P"], defines["M"], defines["V"]
    text = PROGRAM.read_text()
    actions = load_text(text, defines=defines, filename="count.pipe").action_count()
    ours = pipeforge_times(text, defines, args.repeat)
    torch_build = torch_build_time(ranks, microbatches, per_rank, args.repeat)
    csv = csv_times(ranks, microbatches, per_rank, args.repeat)

    print(f"interleaved 1F1B, P={ranks} M={microbatches} V={per_rank}: {actions} actions, best of {args.repeat}")
    print(f"  same compute order as torch: {same_order_as_torch(text, defines, ranks, microbatches, per_rank)}")
    print(f"  {'what':<58} {'pipeforge':>10} {'torch':>10} {'torch/ours':>11}")
    print(f"  {'grammar load (once per process)':<58} {ours['grammar']:>9.3f}s {'':>10} {'':>11}")
    row("parse+elaborate .pipe vs torch building order", ours["cold"], torch_build)
    row("elaborate again (compiled) vs torch building", ours["warm"], torch_build)
    row("load the canonical .pipe (explicit tokens) vs _load_csv", ours["explicit"], csv["torch"])
    if csv["ours"] is None:
        print(f"  {'read 32-row CSV (torch _load_csv)':<58} {'absent':>10} {csv['torch']:>9.3f}s")
    else:
        row(f"read the {ranks}-row CSV: read_csv vs torch _load_csv", csv["ours"], csv["torch"])


def row(label: str, ours: float, theirs: float) -> None:
    print(f"  {label:<58} {ours:>9.3f}s {theirs:>9.3f}s {theirs / ours:>10.2f}x")


if __name__ == "__main__":
    main()
