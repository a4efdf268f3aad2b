"""The z3 model of a schedule's timing: the checker of record (the only module importing z3).

``check_certificate(groups, constraints, timing)`` -> ``Certificate``: whether the event pass's proposed
timing satisfies every constraint (z3 evaluates the ground formula); ``decide(constraints, seed)`` ->
``Decision``: whether the model is satisfiable with free start times (``verify --solve``), seeded by the
proposal; ``unsat_core(constraints)``: which constraints along a wait cycle are jointly unsatisfiable;
``satisfiable(text)`` for the obligations' models. The constraints are written as SMT-LIB text and
given to libz3 directly, without z3's Python bindings. Why each rewriting is exact: ``docs/verifier.md``.
"""

from __future__ import annotations

from dataclasses import dataclass

import ctypes
import importlib.util
import os
import sys

from pipeforge.verifier.events import Constraint, Timing


@dataclass(frozen=True)
class Certificate:
    checked: bool  # z3 found the proposal satisfies the model
    variables: int


def t(rank: int, k: int) -> str:
    return f"t{rank}_{k}"


def d(rank: int, k: int) -> str:
    return f"d{rank}_{k}"


def smt_of(constraint: Constraint, t=t, d=d) -> str:
    """One constraint as an SMT-LIB term; ``t`` and ``d`` name the start and duration of a slot."""
    kind = constraint[0]
    if kind == "order":
        _, r, k = constraint
        return f"(>= {t(r, k + 1)} (+ {t(r, k)} {d(r, k)}))"
    if kind == "duration":
        _, r, k = constraint
        return f"(>= {d(r, k)} 1)"
    if kind == "rendezvous":
        _, (r, k), (q, j) = constraint
        return f"(= {t(r, k)} {t(q, j)})"
    if kind == "buffered":
        _, (r, k), (q, j) = constraint
        return f"(>= (+ {t(r, k)} {d(r, k)}) (+ {t(q, j)} 1))"
    if kind == "after":
        _, r, k, j = constraint
        return f"(>= {t(r, j)} (+ {t(r, k)} {d(r, k)} {j - k - 1}))"
    if kind == "gap":
        _, r, k, j = constraint
        return f"(>= {t(r, j)} (+ {t(r, k)} {j - k}))"
    if kind == "released":
        _, (r, j), (q, i), n = constraint
        return f"(>= {t(r, j)} (+ {t(q, i)} {n}))"
    if kind == "unmatched":
        (r, k) = constraint[1]
        return f"(< {t(r, k)} {t(r, k)})"
    raise ValueError(f"unknown constraint {constraint!r}")


def slots_of(constraint: Constraint) -> list[tuple[int, int]]:
    kind = constraint[0]
    if kind == "order":
        return [(constraint[1], constraint[2]), (constraint[1], constraint[2] + 1)]
    if kind in ("after", "gap"):
        return [(constraint[1], constraint[2]), (constraint[1], constraint[3])]
    if kind == "duration":
        return [(constraint[1], constraint[2])]
    if kind == "unmatched":
        return [constraint[1]]
    return [constraint[1], constraint[2]]


def declarations(slots, durations: bool = True) -> list[str]:
    lines = []
    for r, k in slots:
        lines.append(f"(declare-const {t(r, k)} Int)")
        if durations:
            lines.append(f"(declare-const {d(r, k)} Int)")
    return lines


def certificate_text(constraints: list[Constraint], timing: Timing) -> str:
    """The conjunction of every constraint of the folded model with the proposed start times
    substituted: a ground formula."""
    start = timing.start

    def proposed(rank: int, k: int) -> str:
        return str(start[rank][k])

    terms = []
    for c in constraints:  # the two common kinds written inline: this loop is the hot one
        if c[0] == "gap":
            row = start[c[1]]
            terms.append(f"(>= {row[c[3]]} (+ {row[c[2]]} {c[3] - c[2]}))")
        elif c[0] == "rendezvous":
            terms.append(f"(= {start[c[1][0]][c[1][1]]} {start[c[2][0]][c[2][1]]})")
        else:
            terms.append(smt_of(c, t=proposed))
    return "(and true " + " ".join(terms) + ")"


def check_certificate(groups: list[list[int]], constraints: list[Constraint], timing: Timing) -> Certificate:
    """z3 evaluates the ground formula: ``true`` exactly when the proposal satisfies every constraint."""
    value = z3_run(f"(simplify {certificate_text(constraints, timing)})")[0]
    return Certificate(value == "true", sum(map(len, groups)))


@dataclass(frozen=True)
class Decision:
    satisfiable: bool
    variables: int
    constraints: int


def decide(constraints: list[Constraint], seed: Timing | None) -> Decision:
    """z3 decides the folded model with free start variables; ``seed`` only guides it."""
    text, variables = decision_text(constraints, seed)
    return Decision(satisfiable(text, "the timing model"), variables, len(constraints))


def satisfiable(text: str, what: str = "a model") -> bool:
    """z3 decides an SMT-LIB text of linear real arithmetic (the timing model, and the order and
    completeness models of ``obligations.py``)."""
    verdict, *rest = z3_run(f"(set-logic QF_LRA)\n{text}\n(check-sat)\n(get-info :reason-unknown)")
    if verdict == "unknown":
        raise RuntimeError(f"internal error: z3 could not decide {what} ({' '.join(rest)})")
    return verdict == "sat"


def decision_text(constraints: list[Constraint], seed: Timing | None) -> tuple[str, int]:
    """The folded model as SMT-LIB, every start time free; with a ``seed``, each variable measured from it.

    ``t = seed + u`` is an exact change of variables (``u`` as free as ``t``): a gap ``t_j - t_k >= c``
    becomes ``u_j - u_k >= c - (seed_j - seed_k)``. When the seed satisfies the model, ``u = 0`` does,
    so z3's simplex starts feasible; when it does not, z3 searches (or refutes) as it would unseeded.
    """
    root = rendezvous_roots(constraints)
    start = seed.start if seed is not None else None
    names: dict[tuple[int, int], tuple[str, int]] = {}

    def var(slot: tuple[int, int]) -> tuple[str, int]:
        found = names.get(slot)
        if found is None:
            r, k = root.get(slot, slot)
            found = names[slot] = (f"t{r}_{k}", start[r][k] if start is not None else 0)
        return found

    terms = []
    for c in constraints:
        kind = c[0]
        if kind == "gap":  # t[r][j] - t[r][k] >= j - k
            (later, at), (earlier, since) = var((c[1], c[3])), var((c[1], c[2]))
            terms.append(f"(>= (- {later} {earlier}) {c[3] - c[2] - at + since})")
        elif kind == "released":  # t[r][j] - t[q][i] >= n
            (later, at), (earlier, since) = var(c[1]), var(c[2])
            terms.append(f"(>= (- {later} {earlier}) {c[3] - at + since})")
        elif kind == "unmatched":
            terms.append("false")
        elif kind != "rendezvous":  # a rendezvous is the shared variable itself
            raise ValueError(f"unknown constraint {c!r}")
    declared = sorted({name for name, _ in names.values()})
    lines = [f"(declare-const {v} Real)" for v in declared]
    lines.append("(assert (and true " + " ".join(terms) + "))")
    return "\n".join(lines), len(declared)


def rendezvous_roots(constraints: list[Constraint]) -> dict[tuple[int, int], tuple[int, int]]:
    """Each slot of a rendezvous component -> the component's least slot (whose variable they share)."""
    parent: dict = {}

    def find(x):
        root = x
        while root in parent:
            root = parent[root]
        while x != root:  # path compression
            parent[x], x = root, parent[x]
        return root

    for c in constraints:
        if c[0] == "rendezvous":
            a, b = find(c[1]), find(c[2])
            if a != b:
                if b < a:
                    a, b = b, a
                parent[b] = a
    return {slot: find(slot) for slot in list(parent)}


def unsat_core(constraints: list[Constraint]) -> list[Constraint] | None:
    """The constraints of a minimal-ish unsatisfiable core, or None if they are satisfiable."""
    unique = list(dict.fromkeys(constraints))
    slots = sorted({slot for c in unique for slot in slots_of(c)})
    lines = ["(set-option :produce-unsat-cores true)"] + declarations(slots)
    lines.extend(f"(assert (! {smt_of(c)} :named c{i}))" for i, c in enumerate(unique))
    lines.append("(check-sat)")
    verdict = z3_run("\n".join(lines) + "\n(get-info :reason-unknown)")[0]
    if verdict != "unsat":
        return None
    lines.append("(get-unsat-core)")
    core = z3_run("\n".join(lines))[1]
    names = set(core.strip("()").split())
    return [c for i, c in enumerate(unique) if f"c{i}" in names]


# --- libz3 ---------------------------------------------------------------------------------


class Z3Library:
    """One z3 context, driven by SMT-LIB commands (the C API's ``Z3_eval_smtlib2_string``)."""

    def __init__(self, lib: ctypes.CDLL):
        void = ctypes.c_void_p
        for name, result, arguments in (("Z3_mk_config", void, []), ("Z3_del_config", None, [void]),
                                        ("Z3_mk_context", void, [void]), ("Z3_set_error_handler", None, [void, void]),
                                        ("Z3_eval_smtlib2_string", ctypes.c_char_p, [void, ctypes.c_char_p])):
            getattr(lib, name).restype = result
            getattr(lib, name).argtypes = arguments
        config = lib.Z3_mk_config()
        self.context = lib.Z3_mk_context(config)
        lib.Z3_del_config(config)
        lib.Z3_set_error_handler(self.context, None)  # errors come back in the output (the default handler exits)
        self.lib = lib

    def run(self, commands: str) -> list[str]:
        """The output lines of ``commands``, run after a ``(reset)``."""
        output = self.lib.Z3_eval_smtlib2_string(self.context, ("(reset)\n" + commands).encode()).decode()
        if "interrupted from keyboard" in output:  # z3 took the Ctrl-C while it worked: pass it on
            raise KeyboardInterrupt
        if "(error" in output:
            raise RuntimeError(f"internal error: z3 refused the model it was given: {output.strip()[:500]}")
        return output.splitlines()


_z3: Z3Library | None = None


def z3_run(commands: str) -> list[str]:
    global _z3
    if _z3 is None:
        _z3 = Z3Library(load_libz3())
    return _z3.run(commands)


def load_libz3() -> ctypes.CDLL:
    """libz3 from the z3-solver package's folder, without importing its Python bindings; where it is
    elsewhere (``Z3_LIBRARY_PATH``, the system), as those bindings find it."""
    spec = importlib.util.find_spec("z3")
    ext = "dll" if sys.platform in ("win32", "cygwin") else "dylib" if sys.platform == "darwin" else "so"
    for folder in (spec.submodule_search_locations or ()) if spec else ():
        path = os.path.join(folder, "lib", f"libz3.{ext}")
        if os.path.isfile(path):
            return ctypes.CDLL(path)
    from z3 import z3core

    return z3core._lib
