"""The z3 model of a schedule's timing: the checker of record (the only module importing z3).

The constraints (``timing.py`` lists them as tuples) are written as one SMT-LIB
text and loaded with ``Solver.from_string``; this is several times faster than
building them through z3's Python API. Two questions are asked:

- ``check_certificate``: does the proposed timing satisfy every constraint of the
  (folded, see ``timing.py``) model? The proposal is substituted for the start
  variables as the text is written, which is what ``solve-eqs`` does with
  ``(assert (= t v))`` equalities, without parsing 2 x 17k declarations and
  equalities first (measured 4x faster at 32 ranks x 128 microbatches x 2 stages);
  ``smt`` then decides every substituted constraint. The proposal is the
  satisfying model: the certificate.
- ``unsat_core``: given only the constraints along a wait cycle, each asserted
  under a name, which of them are jointly unsatisfiable?
"""

from __future__ import annotations

from dataclasses import dataclass

import z3

from pipeforge.verify.timing import Constraint, Timing


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
    """Every constraint of the folded model with the proposed start times substituted."""
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
    return "(assert (and true " + " ".join(terms) + "))"


def check_certificate(groups: list[list[int]], constraints: list[Constraint], timing: Timing) -> Certificate:
    solver = z3.Then("solve-eqs", "smt").solver()
    solver.from_string(certificate_text(constraints, timing))
    verdict = solver.check()
    return Certificate(verdict == z3.sat, sum(map(len, groups)))


def unsat_core(constraints: list[Constraint]) -> list[Constraint] | None:
    """The constraints of a minimal-ish unsatisfiable core, or None if they are satisfiable."""
    unique = list(dict.fromkeys(constraints))
    slots = sorted({slot for c in unique for slot in slots_of(c)})
    lines = ["(set-option :produce-unsat-cores true)"] + declarations(slots)
    lines.extend(f"(assert (! {smt_of(c)} :named c{i}))" for i, c in enumerate(unique))
    solver = z3.Solver()
    solver.from_string("\n".join(lines))
    if solver.check() != z3.unsat:
        return None
    names = {str(name) for name in solver.unsat_core()}
    return [c for i, c in enumerate(unique) if f"c{i}" in names]
