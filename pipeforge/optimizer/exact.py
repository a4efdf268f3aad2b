"""Exact search for small instances: a z3 model of every order, bisection on the worst span.

``solve_exact(graph, incumbent, lower_bound, time_limit=..., choices=None)`` -> ``ExactResult``: the
best order z3 finds of the graph's actions within the memory limit and the time limit, with a proven
lower bound on its worst span (optimal when the two meet); with ``choices``, z3 also decides which of
the graph's R run (the recompute per (stage, microbatch)). ``TooLarge`` for more than ``MAX_ORDER_PAIRS`` ordering
decisions, ``OutOfTime`` when the deadline passes while building. The second module that imports z3
(here z3 chooses the order; ``verifier/model.py`` checks one). The model and why: ``docs/optimize.md``
(Exact search).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction

import z3

from pipeforge.optimizer.evaluate import Graph, Order, evaluate

RELATIVE_TOLERANCE = 1e-7


@dataclass(frozen=True)
class ExactResult:
    order: Order
    lower_bound: float
    upper_bound: float
    optimal: bool
    checks: int
    built: bool = True   # False: the time ran out while the model was being built
    graph: Graph | None = None  # the graph ``order`` is of, where it is not the one searched (``Choices``)

    @property
    def gap(self) -> float:
        return (self.upper_bound - self.lower_bound) / self.upper_bound if self.upper_bound > 0 else 0.0


@dataclass(frozen=True)
class Choices:
    """Which R of the graph searched exact search may drop (its F then keeps its activations, no rebuild
    runs): each such R node with its F node, and what that F adds when it keeps them (``semantics``)."""

    forward: dict[int, int]  # R node -> its F node
    kept: dict[int, float]   # F node -> its memory effect when its R is dropped

    def dropped(self, graph: Graph, order: Order, chosen: set[int]) -> tuple[Graph, Order]:
        """``order`` with every R outside ``chosen`` left out, as an order of its own graph."""
        gone = set(self.forward) - chosen
        actions = [a for i, a in enumerate(graph.actions) if i not in gone]
        smaller = Graph(graph.problem, actions)
        return smaller, tuple(smaller.ids(graph.actions[a] for a in seq if a not in gone) for seq in order)


class OutOfTime(Exception):
    """The deadline passed while the model was being built."""


class TooLarge(Exception):
    """The model would be too large to build and search within any sensible time."""


MAX_ORDER_PAIRS = 6000    # pairs of actions on one rank summed over ranks (P=4, M=8: 4 * C(24, 2) = 1104)
CHECK_EVERY = 500         # constraints written between two looks at the clock


def _num(value: float) -> str:
    """A number as SMT-LIB text, exactly (the float's own rational value)."""
    q = Fraction(value)
    text = f"{abs(q.numerator)}.0" if q.denominator == 1 else f"(/ {abs(q.numerator)}.0 {q.denominator}.0)"
    return f"(- {text})" if q < 0 else text


def _reachability(graph: Graph) -> list[set[int]]:
    """For each action, every action that must come before it (transitive data dependencies)."""
    ancestors: list[set[int] | None] = [None] * len(graph.actions)

    def visit(a: int) -> set[int]:
        found = ancestors[a]
        if found is None:
            found = set()
            for d, _ in graph.deps[a]:
                found.add(d)
                found |= visit(d)
            ancestors[a] = found
        return found

    for a in range(len(graph.actions)):
        visit(a)
    return [found or set() for found in ancestors]


def order_pairs(graph: Graph) -> int:
    """How many ordering Booleans the model needs: pairs of actions on one rank."""
    counts = [0] * graph.problem.ranks
    for r in graph.rank:
        counts[r] += 1
    return sum(n * (n - 1) // 2 for n in counts)


class _ModelText:
    """The model as SMT-LIB 2 text, written line by line, looking at the clock as it goes.

    z3 parses the text in one call (DESIGN.md: about 6x faster than one Python API call per
    constraint).
    """

    def __init__(self, graph: Graph, asap: bool, deadline: float, choices: Choices | None = None):
        self.graph, self.deadline, self.choices = graph, deadline, choices
        self.rebuilt = {} if choices is None else {f: r for r, f in choices.forward.items()}
        n = len(graph.actions)
        self.by_rank = [[a for a in range(n) if graph.rank[a] == r] for r in range(graph.problem.ranks)]
        self.ancestors = _reachability(graph)
        self.before: set[tuple[int, int]] = set()
        self.lines: list[str] = [f"(declare-const s{a} Real)" for a in range(n)] + ["(declare-const Z Real)"]
        self.lines += [f"(declare-const x{r} Bool)" for r in (choices.forward if choices else ())]
        self._data_dependencies()
        for r, actions in enumerate(self.by_rank):
            self._no_overlap(actions)
            self._memory(actions)
            self._span(r, actions)
        if asap:
            for a in range(n):
                self._asap(a)

    def text(self) -> str:
        return "\n".join(self.lines)

    def add(self, line: str) -> None:
        self.lines.append(line)
        if len(self.lines) % CHECK_EVERY == 0 and time.monotonic() > self.deadline:
            raise OutOfTime

    def duration(self, a: int, extra: float = 0.0) -> str:
        """``a``'s duration (plus ``extra``): an R that may be dropped lasts its own only where it runs."""
        if self.choices is not None and a in self.choices.forward:
            return f"(+ (ite x{a} {_num(self.graph.duration[a])} 0.0) {_num(extra)})"
        return _num(self.graph.duration[a] + extra)

    def delta(self, a: int) -> str:
        """What ``a`` adds to its rank's memory: an R that may be dropped only where it runs, its F its
        checkpoint where it does and its whole activation where it does not."""
        delta = _num(self.graph.delta[a])
        if self.choices is not None and a in self.choices.forward:
            return f"(ite x{a} {delta} 0.0)"
        if a in self.rebuilt:
            return f"(ite x{self.rebuilt[a]} {delta} {_num(self.choices.kept[a])})"  # type: ignore[union-attr]
        return delta

    def may_add(self, a: int) -> bool:
        return self.graph.delta[a] > 0 or (a in self.rebuilt and self.choices.kept[a] > 0)  # type: ignore[union-attr]

    def end(self, a: int) -> str:
        return f"(+ s{a} {self.duration(a)})"

    def precedes(self, a: int, b: int) -> str:
        return f"o{a}_{b}" if (a, b) in self.before else f"(not o{b}_{a})"

    def _data_dependencies(self) -> None:
        for a, deps in enumerate(self.graph.deps):
            self.add(f"(assert (>= s{a} 0.0))")
            for d, latency in deps:
                self.add(f"(assert (>= s{a} (+ s{d} {self.duration(d, latency)})))")

    def _no_overlap(self, actions: list[int]) -> None:
        for i, a in enumerate(actions):
            for b in actions[i + 1:]:
                self.before.add((a, b))
                flag = f"o{a}_{b}"
                self.lines.append(f"(declare-const {flag} Bool)")
                if a in self.ancestors[b]:
                    self.add(f"(assert {flag})")
                elif b in self.ancestors[a]:
                    self.add(f"(assert (not {flag}))")
                self.add(f"(assert (=> {flag} (>= s{b} {self.end(a)})))")
                self.add(f"(assert (=> (not {flag}) (>= s{a} {self.end(b)})))")

    def _memory(self, actions: list[int]) -> None:
        limit = self.graph.problem.memory_limit
        if limit is None:
            return
        for b in actions:
            if not self.may_add(b):
                continue
            held = " ".join(f"(ite {self.precedes(a, b)} {self.delta(a)} 0.0)" for a in actions if a != b)
            self.add(f"(assert (<= (+ {self.delta(b)} {held}) {_num(limit)}))")

    def _span(self, r: int, actions: list[int]) -> None:
        if not actions:
            return
        self.lines += [f"(declare-const first{r} Real)", f"(declare-const last{r} Real)"]
        for a in actions:
            self.add(f"(assert (<= first{r} s{a}))")
            self.add(f"(assert (>= last{r} {self.end(a)}))")
        self.add(f"(assert (>= Z (- last{r} first{r})))")

    def _asap(self, b: int) -> None:
        deps = self.graph.deps[b]
        options = [f"(= s{b} (+ s{d} {self.duration(d, latency)}))" for d, latency in deps]
        if not deps:
            options.append(f"(= s{b} 0.0)")
        rank_actions = self.by_rank[self.graph.rank[b]]
        options += [f"(and {self.precedes(a, b)} (= s{b} {self.end(a)}))" for a in rank_actions if a != b]
        self.add(f"(assert (or {' '.join(options)}))")


class _Model:
    """The parsed model: its assertions, a solver holding them, the start variables and Z."""

    def __init__(self, graph: Graph, asap: bool, deadline: float, choices: Choices | None = None):
        text = _ModelText(graph, asap, deadline, choices)
        self.graph, self.by_rank, self.choices = graph, text.by_rank, choices
        # A context of its own: z3's search depends on the ids of the terms a context already holds,
        # so in the shared one the same model could take 0.2 s in one process and a minute in another.
        self.context = z3.Context()
        self.assertions = z3.parse_smt2_string(text.text(), ctx=self.context)
        if time.monotonic() > deadline:
            raise OutOfTime
        self.solver = z3.Solver(ctx=self.context)
        self.solver.add(self.assertions)
        self.start = [z3.Real(f"s{a}", self.context) for a in range(len(graph.actions))]
        self.objective = z3.Real("Z", self.context)

    def order_from_model(self, model: z3.ModelRef | None = None) -> Order:
        model = model if model is not None else self.solver.model()

        def when(a: int) -> Fraction:
            value = _as_fraction(model.eval(self.start[a], model_completion=True))
            return value if value is not None else Fraction(0)

        return tuple(tuple(sorted(actions, key=when)) for actions in self.by_rank)

    def found(self, model: z3.ModelRef | None = None) -> tuple[Graph, Order]:
        """The model's order, as an order of the graph it runs (its dropped R left out)."""
        model = model if model is not None else self.solver.model()
        order = self.order_from_model(model)
        if self.choices is None:
            return self.graph, order
        chosen = {r for r in self.choices.forward
                  if z3.is_true(model.eval(z3.Bool(f"x{r}", self.context), model_completion=True))}
        return self.choices.dropped(self.graph, order, chosen)


def solve_exact(graph: Graph, incumbent: Order, lower_bound: float, *, time_limit: float,
                asap: bool = True, progress: Callable[[float, str], None] | None = None,
                choices: Choices | None = None, start: Graph | None = None) -> ExactResult:
    """The best order of ``graph`` within ``time_limit`` seconds, with a proven bound on the worst span.

    ``incumbent`` is a valid order (its span is the first upper bound) and
    ``lower_bound`` a proven bound. First z3's ``Optimize`` minimizes the worst
    span (two thirds of the time); if it does not finish, bisection with
    incremental checks tightens the bound with the time left.
    """
    deadline = time.monotonic() + time_limit
    start = graph if start is None else start
    best = evaluate(start, incumbent)
    if best is None:
        raise ValueError("the incumbent order does not run")
    pairs = order_pairs(graph)
    if pairs > MAX_ORDER_PAIRS:
        raise TooLarge(f"exact search needs {pairs} ordering decisions here (pairs of actions on one rank); "
                       f"it can prove results only up to {MAX_ORDER_PAIRS} (about 4 ranks x 8 microbatches)")
    try:
        model = _Model(graph, asap, deadline, choices)
    except OutOfTime:
        return ExactResult(incumbent, lower_bound, best.max_span, False, 0, built=False, graph=start)
    search = _Bisection(model, lower_bound, best.max_span, incumbent, start)
    search.minimize(max(0.0, deadline - time.monotonic()) * 2 / 3)
    while not search.closed() and search.probe(deadline - time.monotonic()):
        if progress is not None:
            spent = 1.0 - max(0.0, deadline - time.monotonic()) / time_limit
            progress(min(1.0, spent),
                     f"exact search: best worst span within {_gap(search.low, search.high):.2%} of the optimum")
    return ExactResult(search.order, min(search.low, search.high), search.high, search.closed(), search.checks,
                       graph=search.graph)


class _Bisection:
    """The proven interval [low, high] of the optimal worst span and the best order found."""

    def __init__(self, model: _Model, low: float, high: float, order: Order, graph: Graph):
        self.graph, self.model = graph, model  # the best order and the graph it is of
        self.low, self.high, self.order, self.checks = low, high, order, 0

    def closed(self) -> bool:
        return self.high - self.low <= RELATIVE_TOLERANCE * self.high

    def minimize(self, seconds: float) -> None:
        """z3's Optimize: when it finishes, its optimum is a proven bound and its model an order."""
        optimizer = z3.Optimize(ctx=self.model.context)
        optimizer.add(self.model.assertions)
        objective = optimizer.minimize(self.model.objective)
        optimizer.set("timeout", max(1, int(seconds * 1000)))
        answer = optimizer.check()
        self.checks += 1
        if answer != z3.sat:
            self.keep_interim(optimizer)
            return
        self.keep(self.model.found(optimizer.model()))
        value = _as_fraction(objective.value())
        if value is not None:
            self.low = max(self.low, float(value))

    def keep_interim(self, optimizer: z3.Optimize) -> None:
        """After a timeout, Optimize may still hold the best model it found: keep it if it is better."""
        try:
            model = optimizer.model()
        except z3.Z3Exception:
            return
        if model is not None and len(model) > 0:
            self.keep(self.model.found(model))

    def probe(self, seconds: float) -> bool:
        """One bisection check; False when there is no time left or no progress to make."""
        if seconds <= 0:
            return False
        low, high = self.low, self.high
        target = high * (1 - RELATIVE_TOLERANCE) if high - low < 1e-3 * high else (low + high) / 2
        answer = _check(self.model, target, seconds)
        self.checks += 1
        if answer == z3.unsat:
            self.low = target
            return True
        return answer == z3.sat and self.keep(self.model.found())

    def keep(self, found: tuple[Graph, Order]) -> bool:
        graph, order = found
        better = _improvement(graph, order, self.high)
        if better is not None:
            (self.order, self.high), self.graph = better, graph
        return better is not None


def _as_fraction(value: z3.ExprRef) -> Fraction | None:
    """A z3 numeral as a Fraction (None for anything else, such as a bound with an infinitesimal)."""
    if z3.is_int_value(value):
        return Fraction(value.as_long())
    if z3.is_rational_value(value):
        return Fraction(value.numerator_as_long(), value.denominator_as_long())
    return None


def _check(model: _Model, target: float, seconds: float) -> z3.CheckSatResult:
    model.solver.set("timeout", max(1, int(seconds * 1000)))
    return model.solver.check(model.objective <= z3.RealVal(str(Fraction(target)), model.context))


def _gap(low: float, high: float) -> float:
    """How far above the proven lower bound ``low`` the best span ``high`` may be, as a fraction of it
    (unit free: the search's integer units never reach the user)."""
    return (high - low) / low if low > 0 else 0.0


def _improvement(graph: Graph, found: Order, high: float) -> tuple[Order, float] | None:
    """``found`` and its span if it runs, fits and beats ``high`` (the model's answer is re-simulated)."""
    result = evaluate(graph, found)
    if result is None or not result.fits(graph.problem.memory_limit) or result.max_span >= high:
        return None
    return found, result.max_span
