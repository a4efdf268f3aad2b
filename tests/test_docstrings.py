"""Module docstrings state the contract in a few lines; proofs and narrative live in docs/.

STYLE.md habit 11: what goes in, what comes out, what it guarantees. Proofs go to ``docs/``
(``docs/bounds.md``, ``docs/optimize.md``, ``docs/verifier.md``, ...), measurements to
``benchmarks/README.md``. No module is exempt.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MOST = 15  # lines; aim for about 10
MODULES = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "pipeforge").rglob("*.py"))


def docstring_lines(source: str) -> int:
    text = ast.get_docstring(ast.parse(source), clean=False)
    return len(text.splitlines()) if text else 0


@pytest.mark.parametrize("module", MODULES)
def test_module_docstring_states_the_contract_briefly(module):
    lines = docstring_lines((ROOT / module).read_text())
    assert lines <= MOST, (f"{module}: its module docstring is {lines} lines (at most {MOST}): state the "
                           "contract (what goes in, what comes out, what it guarantees) and move proofs and "
                           "narrative to docs/, measurements to benchmarks/README.md")


def test_the_count_sees_a_long_docstring():
    long = '"""' + "\n".join(f"line {i}" for i in range(MOST + 1)) + '"""\nx = 1\n'
    assert docstring_lines(long) == MOST + 1 and docstring_lines("x = 1\n") == 0
