"""Measured peak bytes of saved activations against ``simulate``'s prediction, every rank and schedule.

    python -m benchmarks.runtime.memory                 # 2 and 4 gloo ranks, M = 8
    python -m benchmarks.runtime.memory --ranks 2 --microbatches 16

The GPT with dropout of ``tests/zoo/gpt_model.py`` (one ``nn.TransformerEncoderLayer`` a stage,
float64) is profiled with ``pipeforge profile`` for each stage count; 1F1B, ZB-H1, interleaved 1F1B
and ZBV, as written, fully recomputed and fully offloaded, run on the gloo ranks with
``count_saved`` (``Pipeline.saved_peak``, the runtime's saved-tensor accounting), and ``simulate``
predicts each rank's peak from the cost file (its peak in M_B times M_B's bytes). Prints measured,
predicted and their ratio per rank, and the saving of recompute and offload as measured and as
predicted. Exits 1 where a ratio is off by more than 5 % (``tests/zoo/saved_peak_jobs.py``). Bytes do
not depend on the machine's load.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from tests.zoo.saved_peak_jobs import measure


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--microbatches", type=int, default=8)
    args = parser.parse_args(argv)
    worst = 0.0
    for ranks in args.ranks:
        with tempfile.TemporaryDirectory() as out:
            rows = measure(ranks, args.microbatches, Path(out))
        table = {(r.schedule, r.how, r.rank): r for r in rows}
        print(f"\n{ranks} ranks, M = {args.microbatches}: saved-activation peak per rank, bytes "
              "(measured / simulate's prediction from the profile)")
        print(f"{'schedule':18s} {'how':10s} {'rank':>4s} {'measured':>10s} {'predicted':>10s} {'ratio':>6s} "
              f"{'vs plain (measured)':>20s} {'(predicted)':>12s}")
        for row in rows:
            plain = table[(row.schedule, "plain", row.rank)]
            worst = max(worst, abs(row.ratio - 1))
            saving = "" if row.how == "plain" else f"{row.measured / plain.measured:20.3f} " \
                                                    f"{row.predicted / plain.predicted:12.3f}"
            print(f"{row.schedule:18s} {row.how:10s} {row.rank:4d} {row.measured:10d} {row.predicted:10.0f} "
                  f"{row.ratio:6.3f} {saving}")
    print(f"\nworst |measured / predicted - 1| = {worst:.4f} (limit 0.05)")
    return 1 if worst > 0.05 else 0


if __name__ == "__main__":
    sys.exit(main())
