"""Importing a generated module from its file."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType


def load_module(path: str) -> ModuleType:
    """Import a generated module from its file (a unique name per path)."""
    name = f"pipeforge_generated_{abs(hash(str(Path(path).resolve())))}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"{path}: not a Python module file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def generated_text(path: str | Path) -> str:
    """The text of a module ``pipeforge codegen`` wrote and of its rank modules, in rank order: the whole
    program as one string (what a test or a reader greps)."""
    from pipeforge.generator import rank_folder  # here, not above: load_module (in every rank) needs no jinja2

    path = Path(path)
    texts = [path.read_text(encoding="utf-8")]
    folder = rank_folder(path)
    if folder is not None:
        ranks = sorted(folder.glob("rank_*.py"), key=lambda p: int(p.stem.removeprefix("rank_")))
        texts += [p.read_text(encoding="utf-8") for p in ranks]
    return "".join(texts)
