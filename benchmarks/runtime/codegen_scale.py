"""Codegen at scale, and what one rank loads: the per-rank layout against the one module of every rank.

    .venv/bin/python -m benchmarks.runtime.codegen_scale            # the three sizes below
    .venv/bin/python -m benchmarks.runtime.codegen_scale --quick    # 1F1B at P=32, M=256 only
    .venv/bin/python -m benchmarks.runtime.codegen_scale --base ../old-main --repeat 2   # side by side
    .venv/bin/python -m benchmarks.runtime.codegen_scale --schedule zbv --base ../old-main --repeat 3
    .venv/bin/python -m benchmarks.runtime.codegen_scale --scaling  # interleaved 1F1B at M = 256, 512, 1024
    .venv/bin/python -m benchmarks.runtime.codegen_scale --phases --schedule zbv --base ../old-main   # where it goes

For each schedule and size, ``pipeforge codegen`` runs as its own process (wall
and CPU seconds, the children's ``getrusage``); then a fresh process imports
torch and ``pipeforge.runtime`` (the baseline every rank pays anyway), loads the
written module the README's way and takes rank ``--rank``'s program as
``make_pipeline`` does (``PROGRAMS[rank]``, which imports that rank's module
only), and reports the seconds and the growth of its resident memory beyond the
baseline (the larger of the resident set's growth, ``/proc/self/statm``, and the
peak's, ``VmHWM`` reset just before the import, else ``ru_maxrss``): once with the
bytecode codegen wrote (none beyond ``generator.BYTECODE_UP_TO`` lowered actions: then the same as
the next); once without it, as where ``__pycache__`` was not copied
or cannot be written ("no-pyc": a module of ``rank_modules.COMPILE_APART_FROM``
lines or more compiles in a child process, whose own peak RSS is "child MB",
measured on its own after the import); and once compiling in the rank itself
("in-rank": what the runtime falls back to where no child can start). The
reference, in the same run: the same process loading the one module holding
every rank's function (``generate()``'s text, what every rank loaded before the
per-rank layout), at the sizes where ``--one-module`` asks for it (P=32 by
default; the 64-rank one takes minutes).

``--base DIR`` runs every codegen and import with DIR's pipeforge too (another checkout, on
``PYTHONPATH``), each pair one after the other (which first alternating), and prints the ratios of
this tree to it: the two share the machine's load. ``--scaling`` times codegen of interleaved 1F1B
at P=64, V=2 and M = 256, 512, 1024 (CPU microseconds per action: flat when it scales linearly).
``--phases`` times codegen's phases one by one in one process (CPU seconds: loading the schedule,
lowering it, rendering the rank modules, verifying on that lowering as codegen does, each of verify's two
halves alone where the tree verifies in halves (``verifier.holds``), and compiling the rank modules in a
fresh process, as codegen's worker does), and the wall time they allow on this machine's cores: with
bytecode, codegen's second core has nothing to compile until the schedule is loaded and lowered, so its
wall is at least that prefix plus the rest shared by two cores (``prefix + (render + verify + compile) /
2``); beyond ``generator.BYTECODE_UP_TO`` a child decides the timing half while codegen renders and then
decides the structural half (``prefix + max(render + structure, timing)``).

Targets (issue 23): codegen at most 10 s, a rank's import at most 0.3 s and
60 MB. The script exits 1 when a rank's import (any of the three) grows the resident
memory by more than 60 MB (memory does not depend on the machine's load; times do, so
they are reported beside the load average, not enforced).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
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
import json, os, resource, subprocess, sys, time
def rss():  # resident now (Linux), else the peak
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except OSError:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
def peak():  # the resident set's peak since reset_peak() (Linux), else since the process began
    try:
        with open("/proc/self/status") as status:
            return next(int(line.split()[1]) for line in status if line.startswith("VmHWM")) / 1024
    except (OSError, StopIteration):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
def reset_peak():  # (Linux >= 4.0: torch's import-time peak must not hide the import's)
    try:
        with open("/proc/self/clear_refs", "w") as clear:
            clear.write("5")
    except OSError:
        pass
import torch
import pipeforge.runtime.pipeline, pipeforge.runtime.rank_modules as rank_modules  # what make_pipeline imports
from pipeforge.tools.generated import load_module
if sys.argv[3] == "here":  # the rank compiles its module itself, as where no child process can
    rank_modules.COMPILE_APART_FROM = float("inf")
reset_peak()
base_rss, base_peak = rss(), peak()
started = time.perf_counter()
module = load_module(sys.argv[1])
program = module.PROGRAMS[int(sys.argv[2])]
seconds = time.perf_counter() - started
found = {"seconds": seconds, "mb": max(rss() - base_rss, peak() - base_peak), "baseline_mb": base_rss}
compiler = getattr(rank_modules, "COMPILER", None)
if sys.argv[3] == "apart" and compiler is not None:  # the compiling child's own peak, on its own
    source = program.__code__.co_filename
    peak_kb = "[line for line in open('/proc/self/status') if line.startswith('VmHWM')][0].split()[1]"
    done = subprocess.run([sys.executable, "-I", "-S", "-c", f"{compiler}\nsys.stderr.write({peak_kb})", source,
                           "0"], input=open(source, "rb").read(), capture_output=True, check=True)
    found["child_mb"] = int(done.stderr) / 1024  # (VmHWM: ru_maxrss counts the image it was forked from)
print(json.dumps(found))
"""


ROOT = Path(__file__).resolve().parents[2]  # the tree this benchmark is part of


def environment(tree: Path = ROOT) -> dict[str, str]:
    """The user's default: bytecode written (this project's shell sets PYTHONDONTWRITEBYTECODE), with
    ``tree``'s pipeforge first on the path."""
    env = dict(os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["PYTHONPATH"] = os.pathsep.join([str(tree), *filter(None, [env.get("PYTHONPATH")])])
    return env


def run_codegen(name: str, defines: dict[str, int], out: Path, tree: Path = ROOT) -> dict:
    args = [sys.executable, "-m", "pipeforge", "codegen", name, "-o", str(out), "--json"]
    for key, value in defines.items():
        args += ["-D", f"{key}={value}"]
    before = os.times()
    started = time.perf_counter()
    done = subprocess.run(args, capture_output=True, text=True, env=environment(tree), cwd=tree, check=False)
    wall = time.perf_counter() - started
    after = os.times()
    if done.returncode != 0:
        raise SystemExit(f"codegen {name} failed ({done.returncode}): {done.stderr.strip()}")
    cpu = (after.children_user - before.children_user) + (after.children_system - before.children_system)
    return {"wall": wall, "cpu": cpu, **json.loads(done.stdout)}


def probe_import(module: Path, rank: int, tree: Path = ROOT, compiling: str = "apart") -> dict:
    """Rank ``rank``'s import in a fresh process; ``compiling="here"``: a module it must compile, it
    compiles itself (the runtime's fallback where no child process can start)."""
    done = subprocess.run([sys.executable, "-c", IMPORT_PROBE, str(module), str(rank), compiling], capture_output=True,
                          text=True, env=environment(tree), cwd=tree, check=False)  # (cwd: python -c looks there first)
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


def without_bytecode(folder: Path) -> None:
    """The rank modules as copied without ``__pycache__``: a rank must compile its module."""
    for cached in folder.glob("__pycache__"):
        shutil.rmtree(cached)


def measure(name: str, defines: dict[str, int], rank: int, tree: Path, one_module_at: list[int]) -> dict:
    """Codegen, then the import of rank ``rank`` with the bytecode codegen wrote and without it."""
    with tempfile.TemporaryDirectory(prefix="pipeforge-codegen-scale-") as tmp:
        made = run_codegen(name, defines, Path(tmp) / "gen", tree)
        mine = probe_import(Path(made["module"]), rank, tree)
        without_bytecode(Path(made["rank_folder"]))
        compiling = probe_import(Path(made["module"]), rank, tree)
        without_bytecode(Path(made["rank_folder"]))  # (the import before wrote it again)
        here = probe_import(Path(made["module"]), rank, tree, "here")
        theirs = probe_import(one_module(name, defines, Path(tmp)), rank, tree) \
            if defines["P"] in one_module_at else None
        files = len(list(Path(made["rank_folder"]).glob("rank_*.py")))
    return {"made": made, "import": mine, "compiling": compiling, "here": here, "one_module": theirs,
            "files": files}


def row(name: str, defines: dict[str, int], tree: str, found: dict) -> str:
    made, mine, compiling, theirs = found["made"], found["import"], found["compiling"], found["one_module"]
    here = found["here"]
    reference = f"{theirs['seconds']:>12.2f} {theirs['mb']:>13.0f}" if theirs else f"{'-':>12} {'-':>13}"
    child = f"{compiling['child_mb']:>8.1f}" if "child_mb" in compiling else f"{'-':>8}"
    return (f"{name:<18} {defines['P']:>3} {defines['M']:>5} {defines.get('V', ''):>2} {tree:>6} "
            f"{made['wall']:>9.2f} {made['cpu']:>6.2f} {found['files']:>10} {mine['seconds']:>8.3f} "
            f"{mine['mb']:>9.1f} {compiling['seconds']:>13.3f} {compiling['mb']:>9.1f} {child} "
            f"{here['seconds']:>9.3f} {here['mb']:>10.1f} {reference}")


def ratios(name: str, defines: dict[str, int], ours: list[dict], base: list[dict]) -> str:
    def median(found: list[dict], *path: str) -> float:
        values = []
        for item in found:
            for key in path:
                item = item[key]
            values.append(item)
        return statistics.median(values)

    parts = [f"{what} {median(ours, *path) / median(base, *path):.2f}x" for what, path in
             (("codegen wall", ("made", "wall")), ("codegen cpu", ("made", "cpu")),
              ("import s", ("import", "seconds")), ("import MB", ("import", "mb")),
              ("no-pyc import s", ("compiling", "seconds")), ("no-pyc MB", ("compiling", "mb")),
              ("in-rank compile MB", ("here", "mb")))]
    return f"  ratio this/base, {name} P={defines['P']} M={defines['M']} (medians): " + ", ".join(parts)


def scaling(repeat: int) -> None:
    """Codegen CPU per action of interleaved 1F1B at P=64, V=2 as M doubles."""
    import pipeforge

    print(f"{'schedule':<18} {'P':>3} {'M':>5} {'V':>2} {'actions':>8} {'codegen s':>9} {'cpu s':>6} "
          f"{'cpu us/action':>13}")
    for m in (256, 512, 1024):
        defines = {"P": 64, "M": m, "V": 2}
        actions = pipeforge.load("interleaved-1f1b", defines=defines).action_count()
        times = []
        for _ in range(repeat):
            with tempfile.TemporaryDirectory(prefix="pipeforge-codegen-scale-") as tmp:
                times.append(run_codegen("interleaved-1f1b", defines, Path(tmp) / "gen"))
        wall, cpu = statistics.median(t["wall"] for t in times), statistics.median(t["cpu"] for t in times)
        print(f"{'interleaved-1f1b':<18} {64:>3} {m:>5} {2:>2} {actions:>8} {wall:>9.2f} {cpu:>6.2f} "
              f"{cpu / actions * 1e6:>13.1f}", flush=True)


PHASE_PROBE = r"""
import gc, json, subprocess, sys, time
gc.disable()  # (as the command: pipeforge.cli pauses the collector)
import pipeforge
from pipeforge import generator
from pipeforge.verifier import verify
name, defines = sys.argv[1], json.loads(sys.argv[2])
found = {}
def timed(phase, work):
    started = time.process_time()
    value = work()
    found[phase] = time.process_time() - started
    return value
schedule = timed("load", lambda: pipeforge.load(name, defines=defines))
lowered = timed("lower", lambda: generator._lowering(schedule, "rendezvous"))
files = timed("render", lambda: generator.render_files(lowered.schedule, "m", origins=lowered.origins))
report = timed("verify", lambda: verify(schedule, semantics="rendezvous", certify=False, lowered=lowered))
assert report.valid, report
if hasattr(generator, "with_bytecode"):  # (a tree that writes bytecode only up to a size verifies in halves)
    from pipeforge.verifier import holds
    for half in ("structure", "timing"):
        assert timed(half, lambda: holds(schedule, half, lowered=lowered))
    found["bytecode"] = generator.with_bytecode(lowered.schedule)
compiling = "import marshal, sys, time\ntexts = marshal.load(sys.stdin.buffer)\nstarted = time.process_time()\n" \
    "codes = [compile(text, 'rank', 'exec', dont_inherit=True) for text in texts]\n" \
    "print(time.process_time() - started)"
import marshal
done = subprocess.run([sys.executable, "-I", "-S", "-c", compiling], input=marshal.dumps(list(files.ranks)),
                      capture_output=True, check=True)
found["compile"] = float(done.stdout)
print(json.dumps(found))
"""
PHASES = ("load", "lower", "render", "verify", "structure", "timing", "compile")


def phases(name: str, defines: dict[str, int], tree: Path) -> dict[str, float]:
    done = subprocess.run([sys.executable, "-c", PHASE_PROBE, name, json.dumps(defines)], capture_output=True,
                          text=True, env=environment(tree), cwd=tree, check=False)
    if done.returncode != 0:
        raise SystemExit(f"timing the phases of {name} failed: {done.stderr.strip()[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def phase_row(name: str, label: str, found: dict[str, float]) -> str:
    """CPU seconds of each phase, the total codegen spends, and the wall that allows on two cores: with
    bytecode, ``load + lower + (render + verify + compile) / 2``; without it (a tree that verifies a large
    schedule in halves), ``load + lower + max(render + structure, timing)``."""
    prefix = found["load"] + found["lower"]
    if found.get("bytecode", True):
        spent = ("load", "lower", "render", "verify", "compile")
        bound = prefix + (found["render"] + found["verify"] + found["compile"]) / 2
    else:
        spent = ("load", "lower", "render", "structure", "timing")
        bound = prefix + max(found["render"] + found["structure"], found["timing"])
    return (f"{name:<18} {label:>6} " + " ".join(f"{found[phase]:>9.2f}" if phase in found else f"{'-':>9}"
                                                 for phase in PHASES)
            + f" {sum(found[phase] for phase in spent):>7.2f} {bound:>10.2f}")


def phase_table(cases, trees, repeat: int) -> None:
    """Each phase's CPU seconds (medians of ``repeat``, the trees alternating)."""
    print(f"{'schedule':<18} {'tree':>6} " + " ".join(f"{phase:>9}" for phase in PHASES)
          + f" {'total':>7} {'wall >= s':>10}")
    for name, defines in cases:
        found: dict[str, list[dict[str, float]]] = {label: [] for label, _ in trees}
        for attempt in range(repeat):
            for label, tree in trees if attempt % 2 == 0 else trees[::-1]:
                found[label].append(phases(name, defines, tree))
        for label, _ in trees:
            medians = {phase: statistics.median(f[phase] for f in found[label])
                       for phase in PHASES if phase in found[label][0]}
            print(phase_row(name, label, {**medians, "bytecode": found[label][0].get("bytecode", True)}), flush=True)
    print("CPU seconds per phase in one process (compile: the rank modules in a fresh one, as codegen's worker; "
          "structure, timing: verify's halves, where the tree verifies in halves); total: what codegen spends; "
          "wall >= load + lower + (render + verify + compile) / 2 on two cores with bytecode, "
          "load + lower + max(render + structure, timing) without (the sources alone, verified in halves)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1F1B at P=32, M=256 only")
    parser.add_argument("--rank", type=int, default=5, help="the rank whose import is measured")
    parser.add_argument("--one-module", type=int, nargs="*", default=[32], metavar="P",
                        help="rank counts at which the one-module reference is loaded too (default 32)")
    parser.add_argument("--base", type=Path, metavar="DIR",
                        help="another checkout of pipeforge measured side by side with this one")
    parser.add_argument("--repeat", type=int, default=1, help="runs of each measurement (medians reported)")
    parser.add_argument("--scaling", action="store_true", help="interleaved 1F1B at M = 256, 512, 1024 only")
    parser.add_argument("--phases", action="store_true", help="CPU seconds of each phase of codegen, and the wall "
                                                               "they allow on two cores")
    parser.add_argument("--schedule", action="append", choices=[name for name, _ in CASES], metavar="NAME",
                        help="measure only this case (repeatable; default: all three)")
    args = parser.parse_args(argv)
    print(load_average())
    if args.scaling:
        scaling(args.repeat)
        print(f"after: {load_average()}")
        return 0
    trees = [("this", ROOT)] + ([("base", args.base.resolve())] if args.base else [])
    cases = CASES[:1] if args.quick else [case for case in CASES if not args.schedule or case[0] in args.schedule]
    if args.phases:
        phase_table(cases, trees, args.repeat)
        print(f"after: {load_average()}")
        return 0
    print(f"{'schedule':<18} {'P':>3} {'M':>5} {'V':>2} {'tree':>6} {'codegen s':>9} {'cpu s':>6} {'rank files':>10} "
          f"{'import s':>8} {'import MB':>9} {'no-pyc import':>13} {'no-pyc MB':>9} {'child MB':>8} "
          f"{'in-rank s':>9} {'in-rank MB':>10} {'one-module s':>12} "
          f"{'one-module MB':>13}")
    over = False
    for name, defines in cases:
        rank = min(args.rank, defines["P"] - 1)
        found: dict[str, list[dict]] = {label: [] for label, _ in trees}
        for attempt in range(args.repeat):
            for label, tree in trees if attempt % 2 == 0 else trees[::-1]:  # which runs first alternates
                found[label].append(measure(name, defines, rank, tree, args.one_module if label == "this" else []))
                print(row(name, defines, label, found[label][-1]), flush=True)
        if args.base:
            print(ratios(name, defines, found["this"], found["base"]), flush=True)
        over |= max(max(f["import"]["mb"], f["compiling"]["mb"], f["here"]["mb"]) for f in found["this"]) > IMPORT_MB
    print(f"targets: codegen <= {CODEGEN_SECONDS:g} s, a rank's import <= {IMPORT_SECONDS:g} s and <= {IMPORT_MB:g} MB "
          "(import: seconds and peak-RSS growth of loading the module and rank --rank's program, beyond torch and "
          "pipeforge.runtime); times are wall seconds on this machine under its load; cpu s counts codegen's "
          "worker processes too")
    print(f"after: {load_average()}")
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main())
