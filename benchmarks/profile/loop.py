"""The loop closed: profile a GPT with unequal stages, optimize from 1F1B at 1p memory, run, compare.

    python -m benchmarks.profile.loop            # P=2, M=8, 12 measured rounds, about 2 min
    python -m benchmarks.profile.loop --out /tmp/loop --clock wall
    python -m benchmarks.profile.loop --blocks 1,3 --microbatches 6 --steps 40

1. ``pipeforge profile benchmarks/profile/gpt_unequal.py --stages P`` writes the cost file
   (stage 0 holds the embedding, the last stage the LM head, each about as heavy
   as two blocks; ``--blocks 1,3`` puts 1 transformer block on stage 0 and 3 on
   stage 1, so 2 stages cost about 3 : 5; the default, 2 a stage, makes them
   4 : 4 on 2 ranks).
2. ``pipeforge optimize 1f1b --costs costs.json --memory-limit P`` (1p memory).
3. Every library schedule with P stages on P ranks, the optimized one, a second
   copy of 1F1B (``1f1b A/A``: the noise of the machine, a ratio that should be 1)
   and, on 2 ranks, ``deferred-w`` (a schedule built by hand: the last rank fuses
   B except for its first and last microbatch, whose W it runs at the very end)
   are simulated with the cost file (the prediction) and run on P local gloo
   processes (``pipeforge.tools.step_timing.time_schedules``: the schedules take
   turns step by step, one torch thread a rank, the step time is the slowest
   rank's), every measured step traced (``pipeline.trace``).

Reported, per schedule: predicted and measured step time, measured / predicted,
the prediction from the costs the run itself measured (``in-situ``: the median
F, I, W, B of the traced steps: what is left of the error there is the
simulator's, the rest the profile's), the prediction from the schedule's own
costs in the run (``own``: the medians of its own traced steps; where it is
right and in-situ is not, the costs of an action depend on the schedule around
it: a W long after its I finds its tensors out of cache), and how many cores a step kept busy
(CPU time summed over the ranks / wall time). Then: the rank correlation
(Spearman) and mean relative error of both predictions; each cost as profiled
and as run; where a step's time went (compute, waits, the runtime's own work per
action and outside the program); the measured ratios (median over rounds of the
per-round ratio, with its distribution-free 95 % interval, the sign test's p
that the schedule is not the faster, and the ratio of the two fastest steps,
which a slow step cannot move) of the optimized schedule to 1F1B and to ZB-H1
beside the predicted ones, and the A/A ratio with the spread of its per-round
ratios (a win: the whole interval below 1); the
load average before and after. ``--out`` keeps costs.json, optimized.pipe,
results.json and, per schedule, ``timeline-NAME.json``: the step simulated with
the run's own costs and one measured step (the median round's) side by side as a
Chrome/Perfetto trace.

``--plan`` runs the plan arm instead: ``pipeforge profile MODEL --per-layer``
(``--model``: the GPT above as one layer list, default; ``llama_unequal.py``, a
Hugging Face Llama whose head weighs about three layers; ``--layers`` of them,
default 2 a rank), ``pipeforge plan`` on those costs (``--schedules`` to choose
from), then the plan's schedule run with the plan's layer map, with the even
split and with the even split again (A/A), each cut by ``pipeforge.split`` from
the model file's whole model, taking turns step by step; reported: the predicted
plan / even ratio and the measured one with its 95 % interval.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from pipeforge.generator import codegen
from pipeforge.inputs import load
from pipeforge.library import load_library_schedule, names
from pipeforge.runtime.step_trace import Trace, chrome_events, compute_costs
from pipeforge.sim import simulate
from pipeforge.sim.costfile import with_cost_file
from pipeforge.sim.costs import memory_for, resolve_costs
from pipeforge.tools.launch import spawn
from pipeforge.tools.step_timing import TimingJob

ROOT = Path(__file__).resolve().parents[2]

MODEL = ROOT / "benchmarks" / "profile" / "gpt_unequal.py"
AA = "1f1b A/A"


def pipeforge_cli(*argv: str) -> str:
    done = subprocess.run([sys.executable, "-m", "pipeforge", *argv], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    if done.returncode != 0:
        raise SystemExit(f"pipeforge {' '.join(argv)} failed ({done.returncode}):\n{done.stderr}")
    return done.stdout


def timeline(schedule, cost_path: Path):
    schedule = with_cost_file(schedule, cost_path)
    return simulate(schedule, resolve_costs(schedule, None), memory=memory_for(schedule, None))


def spearman(xs: list[float], ys: list[float]) -> float:
    def ranks(values):
        order = sorted(range(len(values)), key=values.__getitem__)
        out = [0.0] * len(values)
        for rank, index in enumerate(order):
            out[index] = float(rank)
        return out

    rx, ry = ranks(xs), ranks(ys)
    mx, my = statistics.mean(rx), statistics.mean(ry)
    cov = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    return cov / (sum((a - mx) ** 2 for a in rx) * sum((b - my) ** 2 for b in ry)) ** 0.5


def deferred_w(P: int, M: int) -> str:
    """On 2 ranks: ZB-H1's rank 0; rank 1 splits only its first and last microbatch and runs both W last."""
    r0 = ["0F0", "0F1"] + [a for m in range(M - 2) for a in (f"0I{m}", f"0W{m}", f"0F{m + 2}")]
    r0 += [f"0I{M - 2}", f"0W{M - 2}", f"0I{M - 1}", f"0W{M - 1}"]
    r1 = ["1F0", "1I0"] + [a for m in range(1, M - 1) for a in (f"1F{m}", f"1B{m}")]
    r1 += [f"1F{M - 1}", f"1I{M - 1}", "1W0", f"1W{M - 1}"]
    return (f"schedule deferred_w(P = {P}, M = {M}) {{\n    ranks {P}\n    stages {P} placement loop\n"
            f"    microbatches {M}\n    rank 0 {{ {' '.join(r0)} }}\n    rank 1 {{ {' '.join(r1)} }}\n}}\n")


def schedules_to_run(P: int, M: int, optimized: Path, out: Path) -> dict:
    found = {}
    for name in names():
        schedule = load_library_schedule(name, {"P": P, "M": M})
        if schedule.stages == P and schedule.ranks == P:
            found[name] = schedule
    found["optimized"] = load(str(optimized))
    found[AA] = found["1f1b"]
    if P == 2 and M >= 3:
        hand = out / "deferred-w.pipe"
        hand.write_text(deferred_w(P, M), encoding="utf-8")
        found["deferred-w"] = load(str(hand))
    return found


def in_situ_costs(profiled: dict, traces: list[Trace], single_chain: list[Trace]) -> dict:
    """The profile's cost file with each F, I, W, B replaced by its median in the run's traces, and the
    step and dispatch overheads by their medians over the single-chain schedules' traced steps."""
    measured = compute_costs(traces)
    stages = [{**entry, **{k: round(v, 6) for k, v in measured.get(s, {}).items()}}
              for s, entry in enumerate(profiled["stages"])]
    step = round(statistics.median(t.outside() for t in single_chain) * 1000.0, 6)
    dispatch = round(statistics.median(t.dispatch() for t in single_chain) * 1000.0, 6)
    return {**profiled, "stages": stages, "step": step, "dispatch": dispatch}


def file_name(schedule_name: str) -> str:
    return schedule_name.replace(" ", "").replace("/", "")


def per_round_ratio(a: list[float], b: list[float]) -> list[float]:
    return [x / y for x, y in zip(a, b)]


def quartiles(values: list[float]) -> tuple[float, float]:
    q = statistics.quantiles(values, n=4) if len(values) >= 2 else [values[0]] * 3
    return q[0], q[2]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--microbatches", type=int, default=8)
    parser.add_argument("--steps", type=int, default=12, help="measured rounds (a step of every schedule each)")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--profile-steps", type=int, default=5)
    parser.add_argument("--profile-warmup", type=int, default=3)
    parser.add_argument("--clock", choices=("wall", "cpu"), default="cpu",
                        help="how the profile times each action (pipeforge profile --clock; cpu: steady under load)")
    parser.add_argument("--blocks", help="transformer blocks per stage, comma separated (the model's GPT_BLOCKS; "
                                         "default 2 a stage)")
    parser.add_argument("--no-pin", dest="pin", action="store_false",
                        help="let the ranks move between cores (default: each on a core of its own, "
                             "where there are enough: profile --pin)")
    parser.add_argument("--time-limit", type=float, default=10.0, help="optimize --time-limit")
    parser.add_argument("--out", help="folder for costs.json, optimized.pipe, results.json and timelines "
                                      "(default: temporary)")
    parser.add_argument("--plan", action="store_true",
                        help="the plan arm instead: profile --per-layer, plan, then the plan's layer map against the "
                             "even split on the plan's schedule (see the module docstring)")
    parser.add_argument("--model", default=str(MODEL), help="with --plan: the model file (pipeforge_layers(); "
                                                            "default the GPT, benchmarks/profile/llama_unequal.py the "
                                                            "Hugging Face Llama)")
    parser.add_argument("--layers", type=int, help="with --plan: the model's layers (PLAN_LAYERS; default 2 a rank)")
    parser.add_argument("--schedules", help="with --plan: the library schedules plan may choose from (default all)")
    parser.add_argument("--repeats", type=int, default=3, help="with --plan: profile --per-layer --repeats")
    args = parser.parse_args()
    if args.plan:
        return plan_arm(args)
    if args.blocks:
        os.environ["GPT_BLOCKS"] = args.blocks  # the profile's and the run's ranks inherit it
    out = Path(args.out or tempfile.mkdtemp(prefix="pipeforge-loop-"))
    out.mkdir(parents=True, exist_ok=True)
    P, M = args.ranks, args.microbatches
    costs, optimized = out / "costs.json", out / "optimized.pipe"
    load_before = os.getloadavg()
    print(f"{os.cpu_count()} cores; load average {' '.join(f'{x:.2f}' for x in load_before)}")

    print(pipeforge_cli("profile", str(MODEL), "--stages", str(P), "--microbatches", str(M),
                        "--steps", str(args.profile_steps), "--warmup", str(args.profile_warmup),
                        "--clock", args.clock, *(["--pin"] if args.pin else []), "-o", str(costs)))
    print(pipeforge_cli("optimize", "1f1b", "-D", f"P={P}", "-D", f"M={M}", "--costs", str(costs),
                        "--memory-limit", str(P), "--time-limit", str(args.time_limit), "-o", str(optimized)))

    schedules = schedules_to_run(P, M, optimized, out)
    twins = same_order_as(schedules["optimized"], schedules)
    print(f"the optimized order is {'the same as ' + ', '.join(twins) if twins else 'none of the library' + chr(39) + 's'}")
    value = measure(schedules, P, args)
    names_ = list(schedules)
    traces = {name: [[Trace.from_json(t) for t in rank_traces[i]] for rank_traces in value["traces"]]
              for i, name in enumerate(names_)}  # name -> rank -> steps
    all_traces = [t for name in names_ for rank in traces[name] for t in rank]
    profiled = json.loads(costs.read_text())
    situ = out / "costs-in-situ.json"
    single = [t for name in names_ if schedules[name].chains == 1 for rank in traces[name] for t in rank]
    situ.write_text(json.dumps(in_situ_costs(profiled, all_traces, single), indent=2) + "\n")

    rows = []
    print(f"{'schedule':12}{'predicted':>11}{'measured':>10}{'meas/pred':>11}{'in-situ':>9}{'meas/in-situ':>14}"
          f"{'own':>8}{'meas/own':>10}{'cores busy':>12}   (ms)")
    situ_costs = json.loads(situ.read_text())
    for i, (name, schedule) in enumerate(schedules.items()):
        own = out / f"costs-own-{file_name(name)}.json"
        mine = [t for rank in traces[name] for t in rank]
        own.write_text(json.dumps(in_situ_costs(situ_costs, mine, mine if schedule.chains == 1 else single),
                                  indent=2) + "\n")
        guess, situ_line, own_line = timeline(schedule, costs), timeline(schedule, situ), timeline(schedule, own)
        ms, cpu_ms = value["ms"][i], value["cpu_ms"][i]
        rows.append({"schedule": name, "predicted_ms": guess.step_time, "in_situ_ms": situ_line.step_time,
                     "own_ms": own_line.step_time, "makespan_ms": guess.makespan, "measured_ms": ms,
                     "cpu_ms": cpu_ms, "steps_ms": value["steps_ms"][i]})
        print(f"{name:12}{guess.step_time:>11.1f}{ms:>10.1f}{ms / guess.step_time:>11.3f}{situ_line.step_time:>9.1f}"
              f"{ms / situ_line.step_time:>14.3f}{own_line.step_time:>8.1f}{ms / own_line.step_time:>10.3f}"
              f"{cpu_ms / ms:>12.2f}")
        if args.out:
            write_timeline(out / f"timeline-{file_name(name)}.json", situ_line,
                           [rank[len(rank) // 2] for rank in traces[name]], name)
    verdict = accuracy(rows)
    print(costs_table(profiled, json.loads(situ.read_text())))
    print(breakdown_table(schedules, traces))
    verdict.update(ratios(rows))
    load_after = os.getloadavg()
    print(f"load average before {' '.join(f'{x:.2f}' for x in load_before)}, "
          f"after {' '.join(f'{x:.2f}' for x in load_after)}")
    verdict = {**verdict, "optimized_same_order_as": twins, "cores": os.cpu_count(), "load_before": load_before, "load_after": load_after,
               "command": " ".join(sys.argv)}
    (out / "results.json").write_text(json.dumps({"rows": rows, **verdict}, indent=2) + "\n")
    print(f"wrote {out / 'results.json'}")
    return 0


def plan_arm(args) -> int:
    """``pipeforge plan`` against the even split on the plan's own schedule: predicted, then measured."""
    out = Path(args.out or tempfile.mkdtemp(prefix="pipeforge-plan-"))
    out.mkdir(parents=True, exist_ok=True)
    P, M = args.ranks, args.microbatches
    os.environ["PLAN_LAYERS"] = str(args.layers or 2 * P)  # the profile's and the run's ranks inherit it
    # the profile runs on one thread, as each rank does (TimingJob.threads): a machine with fewer cores than
    # threads makes small kernels slow beside large ones, and the ends of the model would look light
    os.environ["OMP_NUM_THREADS"] = "1"
    load_before = os.getloadavg()
    print(f"{os.cpu_count()} cores; load average {' '.join(f'{x:.2f}' for x in load_before)}")
    layer_costs, plan_pipe = out / "layers.json", out / "plan.pipe"
    print(pipeforge_cli("profile", args.model, "--per-layer", "--microbatches", str(M), "--repeats", str(args.repeats),
                        "-o", str(layer_costs)))  # each layer timed on one microbatch, as the ranks run it
    chosen = json.loads(pipeforge_cli("plan", str(layer_costs), "--ranks", str(P), "--microbatches", str(M),
                                      *(["--schedules", args.schedules] if args.schedules else []),
                                      "-o", str(plan_pipe), "--layer-map", str(out / "plan.layers.json"),
                                      "--force", "--json"))
    predicted = chosen["predicted_step"] / chosen["even_split_step"]
    print(f"plan: {chosen['schedule']} with layers {chosen['layers']}, predicted step {chosen['predicted_step']:.1f}; "
          f"the even split {chosen['even_layers']} on {chosen['schedule']}: {chosen['even_split_step']:.1f} "
          f"(plan / even {predicted:.3f}; lower bound {chosen['lower_bound']:.1f}) {chosen['units'] or 'ms'}")
    schedule = load(str(plan_pipe))
    arms = {"plan": tuple(chosen["layers"]), "even": tuple(chosen["even_layers"]), "even A/A": tuple(chosen["even_layers"])}
    with tempfile.TemporaryDirectory(prefix="pipeforge-plan-gen-") as gen:
        paths = []
        for index in range(len(arms)):
            folder = Path(gen) / f"s{index}"
            folder.mkdir()
            paths.append(str(codegen(schedule, str(folder))))
        job = TimingJob(args.model, tuple(paths), steps=args.steps, warmup=args.warmup, pin=args.pin,
                        layers=tuple(arms.values()))
        outcomes = spawn("pipeforge.tools.step_timing:time_schedules", P, job, timeout=300.0,
                         deadline=60.0 + 10.0 * len(paths) * (args.steps + args.warmup) * 4)
    failed = [o for o in outcomes if not o.ok]
    if failed:
        raise SystemExit("\n".join(f"rank {o.rank}: {o.error}" for o in failed))
    steps = dict(zip(arms, sorted(outcomes, key=lambda o: o.rank)[0].value["steps_ms"]))
    found = {}
    for a, b in (("plan", "even"), ("even A/A", "even")):
        per_round = per_round_ratio(steps[a], steps[b])
        ci = median_interval(per_round)
        found[f"{a} / {b}"] = {"measured": statistics.median(per_round), "interval_95": list(ci),
                               "faster_rounds": sum(r < 1.0 for r in per_round), "rounds": len(per_round),
                               "wins_measured": ci[1] < 1.0}
        print(f"  {a + ' / ' + b:18} measured {statistics.median(per_round):.3f} [{ci[0]:.3f}-{ci[1]:.3f}], "
              f"faster in {found[f'{a} / {b}']['faster_rounds']} of {len(per_round)} rounds; medians "
              f"{statistics.median(steps[a]):.1f} / {statistics.median(steps[b]):.1f} ms")
    found["plan / even"]["predicted"] = predicted
    load_after = os.getloadavg()
    print(f"  (a win: the whole 95% interval below 1; the A/A row shows the noise). Load average before "
          f"{' '.join(f'{x:.2f}' for x in load_before)}, after {' '.join(f'{x:.2f}' for x in load_after)}")
    (out / "results.json").write_text(json.dumps({"plan": chosen, "ratios": found, "steps_ms": steps,
                                                  "load_before": load_before, "load_after": load_after,
                                                  "command": " ".join(sys.argv)}, indent=2) + "\n")
    print(f"wrote {out / 'results.json'}")
    return 0


def measure(schedules: dict, P: int, args) -> dict:
    """Every schedule run on P gloo ranks, taking turns; rank 0's step times and every rank's traces."""
    with tempfile.TemporaryDirectory(prefix="pipeforge-loop-gen-") as gen:
        paths = []
        for index, schedule in enumerate(schedules.values()):
            folder = Path(gen) / f"s{index}"
            folder.mkdir()
            paths.append(str(codegen(schedule, str(folder))))
        job = TimingJob(str(MODEL), tuple(paths), steps=args.steps, warmup=args.warmup, trace=True,
                        pin=args.pin)
        outcomes = spawn("pipeforge.tools.step_timing:time_schedules", P, job, timeout=300.0,
                         deadline=60.0 + 10.0 * len(paths) * (args.steps + args.warmup) * 4)
    failed = [o for o in outcomes if not o.ok]
    if failed:
        raise SystemExit("\n".join(f"rank {o.rank}: {o.error}" for o in failed))
    ordered = sorted(outcomes, key=lambda o: o.rank)
    return {**ordered[0].value, "traces": [o.value["traces"] for o in ordered]}


def accuracy(rows: list[dict]) -> dict:
    """Spearman and relative errors of both predictions, over the distinct schedules (the A/A copy left out)."""
    rows = [r for r in rows if r["schedule"] != AA]
    times = [r["measured_ms"] for r in rows]
    verdict = {}
    for key, label in (("predicted_ms", "profile"), ("in_situ_ms", "in-situ"), ("own_ms", "own")):
        guesses = [r[key] for r in rows]
        errors = [abs(t - g) / t for g, t in zip(guesses, times)]
        rho = spearman(guesses, times)
        verdict[label] = {"spearman": rho, "mean_relative_error": statistics.mean(errors),
                          "max_relative_error": max(errors)}
        print(f"prediction from the {label} costs: rank correlation (Spearman) {rho:.3f}; relative error mean "
              f"{statistics.mean(errors):.1%}, max {max(errors):.1%} ({len(rows)} schedules)")
    return verdict


def costs_table(profiled: dict, situ: dict) -> str:
    lines = ["costs (ms): profiled / in the run (median of the traced steps) = ratio"]
    for s, (a, b) in enumerate(zip(profiled["stages"], situ["stages"])):
        parts = [f"{k} {a[k]:.2f}/{b[k]:.2f}={a[k] / b[k]:.2f}" for k in ("F", "I", "W", "B") if k in a and k in b]
        lines.append(f"  stage {s}: " + "  ".join(parts))
    lines.append(f"  dispatch (per action) {profiled.get('dispatch', 0):.3f}/{situ.get('dispatch', 0):.3f}; "
                 f"step (beyond the actions) {profiled.get('step', 0):.2f}/{situ.get('step', 0):.2f}; "
                 f"links {profiled['links']}; chain_sum {profiled.get('chain_sum')}")
    return "\n".join(lines)


def breakdown_table(schedules: dict, traces: dict) -> str:
    lines = ["where a step went (ms, median over steps, per rank): compute | waits | runtime per action "
             "(posts and work between actions) | outside the program (batch split, gradient scaling)"]
    for name in schedules:
        cells = []
        for rank, steps in enumerate(traces[name]):
            parts = [t.breakdown() for t in steps]
            med = lambda key: statistics.median(getattr(p, key) for p in parts) * 1000.0
            per_action = statistics.median(p.per_action for p in parts) * 1000.0
            cells.append(f"r{rank} {med('compute'):.1f} | {med('waits'):.1f} | {per_action:.3f} x "
                         f"{parts[0].actions} | {med('outside'):.2f}")
        lines.append(f"  {name:12}" + "   ".join(cells))
    return "\n".join(lines)


def ratios(rows: list[dict]) -> dict:
    by = {r["schedule"]: r for r in rows}
    found = {}
    pairs = [("optimized", "1f1b"), ("optimized", "zb-h1"), (AA, "1f1b")]
    if "deferred-w" in by:
        pairs += [("deferred-w", "1f1b"), ("deferred-w", "zb-h1")]
    print("measured: median over rounds of the per-round ratio [its 95% confidence interval] (quartiles), the "
          "sign test's p that it is not faster, the ratio of the fastest steps; predicted from the profile; "
          "in-situ; own")
    for a, b in pairs:
        per_round = per_round_ratio(by[a]["steps_ms"], by[b]["steps_ms"])
        low, high = quartiles(per_round)
        ci = median_interval(per_round)
        measured = statistics.median(per_round)
        fastest = min(by[a]["steps_ms"]) / min(by[b]["steps_ms"])
        predicted = by[a]["predicted_ms"] / by[b]["predicted_ms"]
        situ = by[a]["in_situ_ms"] / by[b]["in_situ_ms"]
        own = by[a]["own_ms"] / by[b]["own_ms"]
        faster = sum(r < 1.0 for r in per_round)
        p_value = sign_test(faster, len(per_round))
        found[f"{a} / {b}"] = {"measured": measured, "interval_95": list(ci), "quartiles": [low, high],
                               "fastest_steps": fastest, "predicted": predicted, "in_situ": situ, "own": own,
                               "faster_rounds": faster, "rounds": len(per_round), "sign_test_p": p_value,
                               "wins_measured": ci[1] < 1.0, "wins_predicted": predicted < 1.0}
        print(f"  {a + ' / ' + b:22} measured {measured:.3f} [{ci[0]:.3f}-{ci[1]:.3f}] ({low:.3f}-{high:.3f}), "
              f"faster in {faster} of {len(per_round)} rounds (p {p_value:.3f}), fastest {fastest:.3f}  "
              f"predicted {predicted:.3f}  in-situ {situ:.3f}  own {own:.3f}")
    print("  (a win counts when the whole 95% interval is below 1; the A/A row shows the noise)")
    return {"ratios": found}


def median_interval(values: list[float], confidence: float = 0.95) -> tuple[float, float]:
    """The distribution-free interval for the median: order statistics k and n + 1 - k, with k the largest
    such that fewer than k of n values fall below the median with chance at most (1 - confidence) / 2."""
    ordered, n = sorted(values), len(values)
    k, tail = 0, 0.0
    while k < n // 2 and tail + math.comb(n, k) / 2 ** n <= (1.0 - confidence) / 2:
        tail += math.comb(n, k) / 2 ** n
        k += 1
    return (ordered[k - 1], ordered[n - k]) if k > 0 else (ordered[0], ordered[-1])


def sign_test(faster: int, rounds: int) -> float:
    """The chance of ``faster`` or more faster rounds of ``rounds`` when either is as likely (one-sided)."""
    return sum(math.comb(rounds, k) for k in range(faster, rounds + 1)) / 2 ** rounds


def same_order_as(schedule, schedules: dict) -> list[str]:
    """The library schedules whose compute order on every rank is ``schedule``'s."""
    def order(s):
        return tuple(tuple(str(a) for step in program for a in step.actions if a.is_compute) for program in s.programs)

    mine = order(schedule)
    return [name for name, other in schedules.items() if other is not schedule and name not in ("optimized", AA)
            and order(other) == mine]


def write_timeline(path: Path, simulated, measured: list[Trace], name: str) -> None:
    """The step simulated with the run's costs (process 0) and one measured step (process 1) as one
    Chrome/Perfetto trace."""
    from pipeforge.interop.chrome_trace import trace_events

    document = {"traceEvents": trace_events(simulated) + chrome_events(measured, pid=1, name=f"measured {name}"),
                "displayTimeUnit": "ms"}
    path.write_text(json.dumps(document) + "\n", encoding="utf-8")


if __name__ == "__main__":
    sys.exit(main())
