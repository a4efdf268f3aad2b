"""optimize with recompute and offload: which (stage, microbatch) to recompute or offload under a memory limit.

``optimize_memory(schedule, recompute=none|auto|all, offload=False, ...)`` searches the order of the
schedule's F and backward as ``optimize`` does, under a memory model where a recomputed (or offloaded)
forward holds only its checkpoint (or nothing), then inserts R before each first backward (or OFFLOAD
after each F and RELOAD before it: ``passes.recompute``), and keeps the candidate with the least worst
span among those that verify within the real limit. ``auto``: the best of no recompute, every microbatch
recomputed, and the input's order with each stage recomputing every k-th microbatch (k per stage, the least
recompute that fits: ``selective``). The result always verifies (``pipeforge.verify``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from pipeforge.errors import Argument, ArgumentError, PipeforgeError, UsageError, words
from pipeforge.ir import ActionKind, CostModel, MemorySpec, Schedule, replace_programs
from pipeforge.optimizer.result import OptimizeResult, metrics_of
from pipeforge.optimizer.search import optimize
from pipeforge.passes.recompute import offload as offload_pass
from pipeforge.passes.recompute import recompute as recompute_pass
from pipeforge.verifier import verify
from pipeforge.ir import Step
from pipeforge.sim.simulate import simulate

POLICIES = ("none", "auto", "all")
SAVING = frozenset({ActionKind.R, ActionKind.OFFLOAD, ActionKind.RELOAD})


@dataclass(frozen=True)
class MemoryChoice:
    """What ``optimize_memory`` chose: the policy, and how many (stage, microbatch) it recomputes and offloads."""

    recompute: str
    offload: bool
    recomputed: int
    offloaded: int
    tried: tuple[str, ...]

    def to_json(self) -> dict:
        return {"recompute": self.recompute, "offload": self.offload, "recomputed": self.recomputed,
                "offloaded": self.offloaded, "tried": list(self.tried)}


def strip(schedule: Schedule) -> Schedule:
    """``schedule`` without its R, OFFLOAD and RELOAD steps (what the order search reorders)."""
    programs = tuple(tuple(step for step in program if not (step.actions and step.actions[0].kind in SAVING))
                     for program in schedule.programs)
    if any(a.kind in SAVING for program in programs for step in program for a in step.actions):
        raise UsageError("an overlap step holds R, OFFLOAD or RELOAD: optimize cannot take it apart")
    return replace_programs(schedule, programs)


def fused(schedule: Schedule) -> Schedule:
    """``schedule`` with each I made a B and its W dropped (the backward whole, where the I was)."""
    programs = []
    for program in schedule.programs:
        steps = []
        for step in program:
            if len(step.actions) == 1 and step.actions[0].kind is ActionKind.W:
                continue
            if len(step.actions) == 1 and step.actions[0].kind is ActionKind.I:
                step = Step((step.actions[0]._replace(kind=ActionKind.B),), span=step.span)
            steps.append(step)
        programs.append(tuple(steps))
    return replace_programs(schedule, tuple(programs))


def selective(schedule: Schedule, costs: CostModel, memory: MemorySpec) -> Schedule | None:
    """The input's order with stage s recomputing every k_s-th microbatch, each k_s the largest (the least
    recompute) whose rank fits ``memory.limit``: found for every stage at once by halving each stage's range
    (what one rank holds depends only on its own stages' recompute). None when even k_s = 1 does not fit."""
    stages, m = schedule.stages, schedule.microbatches
    low, high = [1] * stages, [m + 1] * stages  # k in [low, high): low fits (or is 1), high does not
    owner = [schedule.rank_of(s) for s in range(stages)]

    def build(ks: list[int]) -> Schedule:
        which = [(s, b, 0) for s in range(stages) for b in range(m) if ks[s] <= m and b % ks[s] == 0]
        return replace(recompute_pass(schedule, which), memory=memory)

    while any(high[s] - low[s] > 1 for s in range(stages)):
        ks = [(low[s] + high[s]) // 2 if high[s] - low[s] > 1 else low[s] for s in range(stages)]
        peaks = simulate(build(ks), costs).peak_memory
        for s in range(stages):
            if high[s] - low[s] > 1:
                if peaks[owner[s]] <= memory.limit + 1e-9:
                    low[s] = ks[s]
                else:
                    high[s] = ks[s]
    # where even the largest k fits, recompute nothing there (k = m + 1 names no microbatch)
    ks = [low[s] for s in range(stages)]
    found = build(ks)
    if not verify(found).valid:
        return None
    for s in range(stages):
        if high[s] == m + 1:
            trial = build(ks[:s] + [m + 1] + ks[s + 1:])
            if verify(trial).valid:
                ks[s], found = m + 1, trial
    return found


def _plain_result(schedule: Schedule, costs: CostModel, memory: MemorySpec) -> OptimizeResult:
    """A result standing for ``schedule`` as given (when no search gave one to take the fields from)."""
    metrics = metrics_of(schedule, costs, memory)
    return OptimizeResult(schedule, metrics, metrics, 0.0, 0.0, 0.0, False, False, "input", "none", 0.0)


def optimize_memory(schedule: Schedule, *, recompute: str = "none", offload: bool = False,
                    costs: CostModel | None = None, memory_limit: float | None = None, **options
                    ) -> tuple[OptimizeResult, MemoryChoice]:
    """The best verified schedule of ``schedule``'s work under ``memory_limit`` with the recompute policy
    and offload switch given (module doc), and what it chose. ``options`` go to ``optimize``."""
    if recompute not in POLICIES:
        raise ArgumentError(Argument("recompute", value=repr(recompute)), f"expected one of {', '.join(POLICIES)}")
    plain = strip(schedule)
    memory = schedule.memory or MemorySpec()
    limit = memory_limit if memory_limit is not None else memory.limit
    costs = costs or schedule.costs or CostModel()
    weights = options.pop("weights", None)
    if weights is not None:
        memory = replace(memory, weights=weights)
    real = replace(memory, limit=limit)
    stages = range(schedule.stages)
    rebuilt = max((memory.stage_activation(s) - memory.stage_checkpoint(s) for s in stages), default=0.0)
    largest = max((memory.stage_activation(s) for s in stages), default=1.0)
    candidates: list[tuple[OptimizeResult, str]] = []
    tried: list[str] = []
    errors: list[str] = []

    def attempt(name: str, virtual: MemorySpec, virtual_limit: float | None, transform) -> bool:
        if name not in tried:
            tried.append(name)
        if virtual_limit is not None and virtual_limit <= 0:
            errors.append(f"{name}: no room under the limit")
            return False
        try:
            result = optimize(replace(plain, memory=virtual), costs=costs, memory_limit=virtual_limit,
                              weights=virtual.weights, **options)
        except PipeforgeError as error:
            errors.append(f"{name}: {error}")
            return False
        final = transform(result.schedule)
        final = replace(final, memory=real if limit is not None else replace(memory, limit=None))
        if not verify(final).valid:
            errors.append(f"{name}: the result with its memory actions goes over the limit")
            return False
        after = metrics_of(final, result.schedule.costs or costs, final.memory)
        after = replace(after, least_work_bubble_rate=result.after.least_work_bubble_rate)
        candidates.append((replace(result, schedule=final, after=after, memory_limit=limit), name))
        return True

    plans = [name for name, wanted in (("none", recompute in ("none", "auto")),
                                       ("all", recompute == "all" or (recompute == "auto" and limit is not None)),
                                       ("offload", offload)) if wanted]
    if "time_limit" in options:  # the attempts share the time limit
        options["time_limit"] = options["time_limit"] / len(plans)
    if "none" in plans:
        attempt("none", memory, limit, lambda s: s)
    if "all" in plans:
        # a recomputed F holds its checkpoint c; R adds a - c just before the backward, so the search keeps
        # that much room under the limit. First as if I released all but c's weight part (true when each W
        # follows its I closely), and where the result goes over the limit, counting the weight-gradient part
        # w an I leaves until its W from the F on (always within the limit).
        room = None if limit is None else limit - rebuilt
        # (a checkpoint of 0 searched as 1 % of the activation: the search counts forwards by their memory)
        kept = [max(memory.stage_checkpoint(s), 0.01 * memory.stage_activation(s)) for s in stages]
        optimistic = replace(memory, activation=tuple(kept), weight_grad=())
        attempt("all", optimistic, room, recompute_pass)
        attempt("all", optimistic, room, lambda s: recompute_pass(fused(s)))  # each W back into its I: a B
        careful = replace(memory, activation=tuple(kept[s] + memory.stage_weight_grad(s) for s in stages),
                          weight_grad=tuple(memory.stage_weight_grad(s) for s in stages))
        attempt("all", careful, room, recompute_pass)
        given = recompute_pass(plain)  # the input's own order, every microbatch recomputed
        given = replace(given, memory=real if limit is not None else replace(memory, limit=None))
        if verify(given).valid:
            candidates.append((replace(candidates[0][0] if candidates else _plain_result(plain, costs, memory),
                                       schedule=given, after=metrics_of(given, costs, given.memory),
                                       memory_limit=limit), "all"))
    if recompute == "auto" and limit is not None:
        tried.append("selective")
        chosen = selective(plain, costs, real)
        if chosen is not None:
            base = candidates[0][0] if candidates else _plain_result(plain, costs, memory)
            candidates.append((replace(base, schedule=chosen, after=metrics_of(chosen, costs, chosen.memory),
                                       memory_limit=limit), "selective"))
    if "offload" in plans:
        # an offloaded F holds its activation until its OFFLOAD (the next F waits for it), and the RELOAD
        # before its backward adds it back: room for two
        virtual = replace(memory, activation=tuple(max(memory.stage_weight_grad(s), 0.01) for s in stages),
                          weight_grad=tuple(max(memory.stage_weight_grad(s), 0.01) for s in stages))
        attempt("offload", virtual, None if limit is None else limit - 2 * largest, offload_pass)
    fitting = [(r, n) for r, n in candidates if limit is None or max(r.after.peak_memory) <= limit + 1e-9]
    if not fitting:
        switches = (Argument("recompute", value=recompute), *((" and ", Argument("offload")) if offload else ()))
        raise PipeforgeError(words(f"no schedule of {schedule.name!r}'s work fits the memory limit {limit:g} with ",
                                   *switches, ": " + "; ".join(errors)))
    best, name = min(fitting, key=lambda pair: (pair[0].after.max_span, pair[0].after.makespan))
    actions = [a for _, _, a in best.schedule.actions()]
    choice = MemoryChoice(name if name not in ("offload",) else "none", name == "offload",
                          sum(a.kind is ActionKind.R for a in actions),
                          sum(a.kind is ActionKind.OFFLOAD for a in actions), tuple(tried))
    return best, choice


__all__ = ["POLICIES", "MemoryChoice", "optimize_memory", "strip"]
