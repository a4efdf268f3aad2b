"""Codegen at scale, and what one rank loads: the per-rank layout against the one module of every rank.

    .venv/bin/python -m benchmarks.runtime.codegen_scale            # the three sizes below
    .venv/bin/python -m benchmarks.runtime.codegen_scale --quick    # 1F1B at P=32, M=256 only

For each schedule and size, ``pipeforge codegen`` runs as its own process (wall
and CPU seconds, the children's ``getrusage``); then a fresh process imports
torch and ``pipeforge.runtime`` (the baseline every rank pays anyway), loads the
written module the README's way and takes rank ``--rank``'s program as
``make_pipeline`` does (``PROGRAMS[rank]``, which imports that rank's module
only), and reports the seconds and the growth of its resident memory (the larger
of the resident set's growth, ``/proc/self/statm``, and the peak's, ``ru_maxrss``)
beyond the baseline: once with the bytecode codegen wrote, once without it (the
rank compiles its own module, as where ``__pycache__`` cannot be written). The
reference, in the same run: the same
process loading the one module holding every rank's function (``generate()``'s
text, what every rank loaded before the per-rank layout), at the sizes where
``--one-module`` asks for it (P=32 by default; the 64-rank one takes minutes).

Targets (issue 23): codegen at most 10 s, a rank's import at most 0.3 s and
60 MB. The script exits 1 when a rank's import grows the resident memory by
more than 60 MB (memory does not depend on the machine's load; times do, so
they are reported beside the load average, not enforced).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.runtime._harness import load_average

CASES = (("1f1b", {"P": 32, "M": 256}), ("interleaved-1f1b", {"P": 64, "M": 1024, "V": 2}),
         ("zbv", {"P": 64, "M": 1024}))
CODEGEN_SECONDS, IMPORT_SECONDS, IMPORT_MB = 10.0, 0.3, 60.0

IMPORT_PROBE = r"""
import json, os, resource, sys, time
def rss():  # resident now (Linux), else the peak
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except OSError:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
def peak():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
import torch
import pipeforge.runtime.pipeline, pipeforge.runtime.rank_modules  # what make_pipeline imports anyway
from pipeforge.tools.generated import load_module
base_rss, base_peak = rss(), peak()
started = time.perf_counter()
module = load_module(sys.argv[1])
program = module.PROGRAMS[int(sys.argv[2])]
seconds = time.perf_counter() - started
print(json.dumps({"seconds": seconds, "mb": max(rss() - base_rss, peak() - base_peak), "baseline_mb": base_rss}))
"""


def environment() -> dict[str, str]:
    """The user's default: bytecode written (this project's shell sets PYTHONDONTWRITEBYTECODE)."""
    env = dict(os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def run_codegen(name: str, defines: dict[str, int], out: Path) -> dict:
    args = [sys.executable, "-m", "pipeforge", "codegen", name, "-o", str(out), "--json"]
    for key, value in defines.items():
        args += ["-D", f"{key}={value}"]
    before = os.times()
    started = time.perf_counter()
    done = subprocess.run(args, capture_output=True, text=True, env=environment(), check=False)
    wall = time.perf_counter() - started
    after = os.times()
    if done.returncode != 0:
        raise SystemExit(f"codegen {name} failed ({done.returncode}): {done.stderr.strip()}")
    cpu = (after.children_user - before.children_user) + (after.children_system - before.children_system)
    return {"wall": wall, "cpu": cpu, **json.loads(done.stdout)}


def probe_import(module: Path, rank: int) -> dict:
    done = subprocess.run([sys.executable, "-c", IMPORT_PROBE, str(module), str(rank)], capture_output=True,
                          text=True, env=environment(), check=False)
    if done.returncode != 0:
        raise SystemExit(f"importing rank {rank} of {module} failed: {done.stderr.strip()[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def one_module(name: str, defines: dict[str, int], out: Path) -> Path:
    """The module of every rank in one file (``generate()``), written for the reference import."""
    import pipeforge
    from pipeforge.generator import generate

    path = out / "one_module.py"
    path.write_text(generate(pipeforge.load(name, defines=defines)), encoding="utf-8")
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1F1B at P=32, M=256 only")
    parser.add_argument("--rank", type=int, default=5, help="the rank whose import is measured")
    parser.add_argument("--one-module", type=int, nargs="*", default=[32], metavar="P",
                        help="rank counts at which the one-module reference is loaded too (default 32)")
    args = parser.parse_args(argv)
    print(load_average())
    print(f"{'schedule':<18} {'P':>3} {'M':>5} {'V':>2} {'codegen s':>9} {'cpu s':>6} {'rank files':>10} "
          f"{'import s':>8} {'import MB':>9} {'no-pyc import':>13} {'no-pyc MB':>12} {'one-module s':>12} "
          f"{'one-module MB':>13}")
    over = False
    for name, defines in CASES[:1] if args.quick else CASES:
        with tempfile.TemporaryDirectory(prefix="pipeforge-codegen-scale-") as tmp:
            made = run_codegen(name, defines, Path(tmp) / "gen")
            rank = min(args.rank, defines["P"] - 1)
            mine = probe_import(Path(made["module"]), rank)
            for cached in Path(made["rank_folder"]).glob("__pycache__"):  # a rank that compiles its module itself
                shutil.rmtree(cached)
            compiling = probe_import(Path(made["module"]), rank)
            if defines["P"] in args.one_module:
                theirs = probe_import(one_module(name, defines, Path(tmp)), rank)
                reference = f"{theirs['seconds']:>12.2f} {theirs['mb']:>13.0f}"
            else:
                reference = f"{'-':>12} {'-':>13}"
            files = len(list(Path(made["rank_folder"]).glob("rank_*.py")))
            print(f"{name:<18} {defines['P']:>3} {defines['M']:>5} {defines.get('V', ''):>2} {made['wall']:>9.2f} "
                  f"{made['cpu']:>6.2f} {files:>10} {mine['seconds']:>8.3f} {mine['mb']:>9.1f} "
                  f"{compiling['seconds']:>13.3f} {compiling['mb']:>12.1f} {reference}",
                  flush=True)
            over |= max(mine["mb"], compiling["mb"]) > IMPORT_MB
    print(f"targets: codegen <= {CODEGEN_SECONDS:g} s, a rank's import <= {IMPORT_SECONDS:g} s and <= {IMPORT_MB:g} MB "
          "(import: seconds and peak-RSS growth of loading the module and rank --rank's program, beyond torch and "
          "pipeforge.runtime); times are wall seconds on this machine under its load")
    print(f"after: {load_average()}")
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main())
