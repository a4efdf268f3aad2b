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
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
