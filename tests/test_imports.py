"""Where the heavy dependencies may be imported, pinned.

z3 lives in the verifier's model (which loads libz3 itself: importing z3's Python
bindings would cost ``verify`` 50 ms of start-up) and the optimizer's exact search; lark in the
language package; jinja2 in codegen; torch in the runtime (and the ``run``
command that drives it, the tools around it that launch, check and profile, and
the code codegen writes; ``verify --as torch`` runs torch's own lowering functions). Every import statement of
the package is read with ``ast`` (module level and inside functions alike), and
a fresh interpreter shows that loading, verifying, simulating and generating
code import no torch.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from fnmatch import fnmatch
from pathlib import Path

import pipeforge

PACKAGE = Path(pipeforge.__file__).parent
ROOT = PACKAGE.parent

# dependency -> the package files (relative to pipeforge/, fnmatch patterns) that may import it
ALLOWED = {
    "z3": ("verifier/model.py", "optimizer/exact.py"),
    "lark": ("lang/*.py",),
    "jinja2": ("generator.py",),
    "torch": ("runtime/*.py", "tools/*.py", "commands/run.py", "models/*.py", "passes/torch_lowering.py"),
    "hypothesis": ("testing.py",),
    "cairosvg": ("render/png.py",),
}


def imported_roots(tree: ast.AST) -> set[str]:
    """The top-level names of every module a tree imports (absolute imports)."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module.split(".")[0])
    return found


def test_each_heavy_dependency_is_imported_only_where_allowed():
    importers: dict[str, list[str]] = {name: [] for name in ALLOWED}
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE).as_posix()
        for name in imported_roots(ast.parse(path.read_text(encoding="utf-8"))) & set(ALLOWED):
            importers[name].append(relative)
    stray = {name: [file for file in files if not any(fnmatch(file, rule) for rule in ALLOWED[name])]
             for name, files in importers.items()}
    assert not any(stray.values()), f"imported outside their home: {stray}"
    assert importers["z3"] and importers["lark"] and importers["jinja2"] and importers["torch"]


LOADED_AFTER = """
import json, sys, tempfile
import pipeforge
heavy = ("torch", "z3", "lark", "jinja2", "hypothesis")
seen = {"import": sorted(n for n in heavy if n in sys.modules)}
schedule = pipeforge.load("1f1b", defines={"P": 4, "M": 8})
seen["load"] = sorted(n for n in heavy if n in sys.modules)
assert pipeforge.verify(schedule).valid
seen["verify"] = sorted(n for n in heavy if n in sys.modules)
pipeforge.simulate(schedule)
seen["simulate"] = sorted(n for n in heavy if n in sys.modules)
pipeforge.codegen(schedule, tempfile.mkdtemp())
seen["codegen"] = sorted(n for n in heavy if n in sys.modules)
print(json.dumps(seen))
"""


def test_loading_verifying_simulating_and_codegen_import_no_torch(tmp_path):
    done = subprocess.run([sys.executable, "-c", LOADED_AFTER], cwd=tmp_path, capture_output=True, text=True,
                          timeout=240, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen == {
        "import": [],
        "load": ["lark"],
        "verify": ["lark"],  # the verifier drives libz3 through its SMT-LIB entry point, not z3's bindings
        "simulate": ["lark"],
        "codegen": ["jinja2", "lark"],
    }


def test_generated_code_imports_only_torch_and_the_runtime(tmp_path):
    from pipeforge.generator import codegen

    path = codegen(pipeforge.load("1f1b", defines={"P": 2, "M": 2}), tmp_path)
    tree = ast.parse(Path(path).read_text(encoding="utf-8"))
    modules = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    modules |= {f"{node.module}.{alias.name}" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
                for alias in node.names}
    assert {name.split(".")[0] for name in modules} <= {"__future__", "torch", "pipeforge"}, modules
    assert all(name.startswith("pipeforge.runtime") for name in modules if name.startswith("pipeforge")), modules
