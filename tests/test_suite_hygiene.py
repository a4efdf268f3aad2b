"""The test suite fails loudly: helpers are imported plainly, so an import bug is an error, never a skip.

tests/ is a package (every folder with tests has ``__init__.py``) and pytest puts
the repository root on ``sys.path`` (``pythonpath`` in pyproject.toml), so
``pytest`` and ``python -m pytest`` import the same helpers the same way; no test
edits ``sys.path``, and ``importorskip`` is kept for optional third-party packages.
"""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent
OPTIONAL_THIRD_PARTY = {"cairosvg", "torchtitan"}  # libcairo (pipeforge[png]); torchtitan (pipeforge[torchtitan], --no-deps)


def _test_files() -> list[Path]:
    return sorted(path for path in TESTS.rglob("*.py") if "__pycache__" not in path.parts)


def test_every_folder_of_tests_is_a_package():
    folders = {path.parent for path in _test_files()}
    assert [str(f.relative_to(TESTS.parent)) for f in sorted(folders) if not (f / "__init__.py").exists()] == []


def _calls(tree: ast.AST, owner: str, name: str):
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == name
                and isinstance(node.func.value, (ast.Name, ast.Attribute))
                and ast.unparse(node.func.value).endswith(owner)):
            yield node


def test_no_test_edits_sys_path_or_skips_on_a_missing_helper():
    found = []
    for path in _test_files():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        where = path.relative_to(TESTS.parent)
        for call in [*_calls(tree, "sys.path", "insert"), *_calls(tree, "sys.path", "append")]:
            found.append(f"{where}:{call.lineno}: edits sys.path")
        for call in _calls(tree, "pytest", "importorskip"):
            module = call.args[0].value if call.args and isinstance(call.args[0], ast.Constant) else None
            if str(module).split(".")[0] not in OPTIONAL_THIRD_PARTY:
                found.append(f"{where}:{call.lineno}: importorskip({module!r}) would hide an import error")
    assert not found, "\n".join(found)


def test_helpers_are_imported_by_their_full_name():
    helpers = {path.stem for path in _test_files() if not path.stem.startswith(("test_", "conftest", "__"))}
    found = []
    for path in _test_files():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = [alias.name for alias in node.names] if isinstance(node, ast.Import) else \
                [node.module] if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module else []
            found += [f"{path.relative_to(TESTS.parent)}:{node.lineno}: import {name} (write tests....{name})"
                      for name in names if name.split(".")[0] in helpers]
    assert not found, "\n".join(found)
