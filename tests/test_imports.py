"""Where the heavy dependencies may be imported, pinned.

z3 lives in the verifier's model (which loads libz3 itself: importing z3's Python
bindings would cost ``verify`` 50 ms of start-up) and the optimizer's exact search; lark in the
language package; jinja2 in codegen; torch in the runtime (and the ``run``
command that drives it, the tools around it that launch, check and profile, and
the code codegen writes; ``verify --as torch`` runs torch's own lowering functions). Every import statement of
the package is read with ``ast`` (module level and inside functions alike), and
a fresh interpreter shows that loading, verifying, simulating and generating
code import no torch. And the layering: ``LAYERS`` below orders the package's units, lowest
first; nothing imports upward, no two modules import each other (directly or around a cycle), and
the runtime imports nothing of the tools, simulator, optimizer or verifier.
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


# --- the layering: who may import whom ---------------------------------------------------------------

# Lowest first. A module may import modules of its own layer or below, never above; a package's units
# are its top-level modules and subpackages (``pipeforge/sim/bounds/work.py`` is in unit ``sim``).
LAYERS = (
    ("errors", "files", "resources", "_gc", "partition", "bytecode"),  # the foundation
    ("ir",),                                  # values
    ("semantics",),                           # the rules about them
    ("lang",),                                # text to IR
    ("library",),                             # the built-in schedules, loaded through lang
    ("passes",),
    ("verifier",),
    ("sim",),
    ("optimizer",),
    ("interop", "render"),
    ("generator",),
    ("runtime",),                             # what generated code imports
    ("models", "tools"),                      # around the runtime
    ("plan", "inputs", "testing"),
    ("pipeforge", "commands", "cli", "__main__"),  # the public face and the command line
)
LAYER = {unit: level for level, units in enumerate(LAYERS) for unit in units}
# ``pipeforge.__version__`` is the package's metadata: any module may read it.
METADATA = {"__version__"}


def _modules() -> dict[str, Path]:
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _type_checking_only(tree: ast.AST) -> set[int]:
    """Line numbers of the imports under ``if TYPE_CHECKING:`` (annotations only: never run)."""
    lines = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            lines |= {n.lineno for child in node.body for n in ast.walk(child)
                      if isinstance(n, (ast.Import, ast.ImportFrom))}
    return lines


def _imported(module: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The pipeforge modules ``module`` imports, at module level or in a function (not for type checking)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    skip = _type_checking_only(tree)
    found = set()
    for node in ast.walk(tree):
        if not isinstance(node, (ast.Import, ast.ImportFrom)) or node.lineno in skip:
            continue
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        else:
            base = node.module or ""
            if node.level:
                package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
                package = package[:len(package) - node.level + 1]
                base = ".".join(package + ([node.module] if node.module else []))
            names = [alias.name for alias in node.names]
            if base == "pipeforge" and all(name in METADATA for name in names):
                continue
            targets = [f"{base}.{name}" if f"{base}.{name}" in modules else base for name in names]
        for target in targets:
            while target and target not in modules:
                target = target.rpartition(".")[0]
            if target.startswith("pipeforge") and target != module:
                found.add(target)
    return found


def _unit(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "pipeforge"


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {module: _imported(module, path, modules) for module, path in modules.items()}


def test_every_unit_has_a_layer():
    assert {_unit(module) for module in _modules()} <= set(LAYER), set(map(_unit, _modules())) - set(LAYER)


def test_nothing_imports_upward():
    upward = sorted(f"{module} -> {target}" for module, targets in _graph().items() for target in targets
                    if LAYER[_unit(target)] > LAYER[_unit(module)])
    assert not upward, "imports of a higher layer (tests/test_imports.py LAYERS):\n" + "\n".join(upward)


def _cycles(graph: dict[str, set[str]]) -> list[str]:
    """One path for each back edge of a depth-first walk: empty exactly when the graph has no cycle."""
    cycles, state = [], {}

    def visit(module: str, path: list[str]) -> None:
        state[module] = "open"
        for target in sorted(graph[module]):
            if state.get(target) == "open":
                cycles.append(" -> ".join(path[path.index(target):] + [module, target]) if target in path
                              else f"{module} -> {target}")
            elif target not in state:
                visit(target, path + [module])
        state[module] = "done"

    for module in sorted(graph):
        if module not in state:
            visit(module, [])
    return cycles


def test_no_cycles_between_modules():
    cycles = _cycles(_graph())
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


def test_the_runtime_imports_nothing_of_the_tools_around_it():
    forbidden = {"sim", "optimizer", "verifier", "tools", "lang", "passes", "generator", "library", "interop"}
    found = sorted(f"{module} -> {target}" for module, targets in _graph().items() if _unit(module) == "runtime"
                   for target in targets if _unit(target) in forbidden)
    assert not found, "\n".join(found)


def test_the_layering_test_sees_an_upward_import_and_a_cycle(tmp_path):
    modules = {"pipeforge.ir": tmp_path / "ir.py", "pipeforge.sim.a": tmp_path / "a.py",
               "pipeforge.sim.b": tmp_path / "b.py"}
    modules["pipeforge.ir"].write_text("def f():\n    from pipeforge.sim.a import x\n")
    modules["pipeforge.sim.a"].write_text("from pipeforge.sim import b\n")
    modules["pipeforge.sim.b"].write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                          "    from pipeforge.ir import Schedule\nfrom pipeforge.sim.a import x\n")
    assert _imported("pipeforge.ir", modules["pipeforge.ir"], modules) == {"pipeforge.sim.a"}
    assert _imported("pipeforge.sim.a", modules["pipeforge.sim.a"], modules) == {"pipeforge.sim.b"}
    assert _imported("pipeforge.sim.b", modules["pipeforge.sim.b"], modules) == {"pipeforge.sim.a"}
    graph = {module: _imported(module, path, modules) for module, path in modules.items()}
    assert _cycles(graph) == ["pipeforge.sim.a -> pipeforge.sim.b -> pipeforge.sim.a"]
    assert LAYER[_unit("pipeforge.sim.a")] > LAYER[_unit("pipeforge.ir")]


RUNTIME_LOADED = """
import json, sys, tempfile
import pipeforge
from pipeforge.generator import codegen
path = codegen(pipeforge.load("1f1b", defines={"P": 2, "M": 2}), tempfile.mkdtemp())
import importlib.util
spec = importlib.util.spec_from_file_location("generated", path)
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
import pipeforge.runtime as runtime
for name in runtime.__all__:
    getattr(runtime, name)
print(json.dumps(sorted(name for name in sys.modules if name.startswith("pipeforge."))))
"""


def test_the_runtime_is_exactly_what_generated_code_imports(tmp_path):
    done = subprocess.run([sys.executable, "-c", RUNTIME_LOADED], cwd=tmp_path, capture_output=True, text=True,
                          timeout=240, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr[-3000:]
    loaded = set(json.loads(done.stdout.strip().splitlines()[-1]))
    runtime = {f"pipeforge.runtime.{path.stem}" for path in (PACKAGE / "runtime").glob("*.py") if path.stem != "__init__"}
    assert runtime <= loaded, f"in runtime/ but not imported by generated code: {sorted(runtime - loaded)}"
    assert not {name for name in loaded if name.startswith("pipeforge.tools")}
