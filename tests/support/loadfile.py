"""Load a Python file as a module by its path, for files no import statement can name:
scripts with hyphens in their names, files in folders that are not packages. (The repo root
stays off sys.path: its folder operator/ would shadow the standard library's `operator`.)"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType


def load_file(path: Path, name: str) -> ModuleType:
    """The module in `path`, registered as `name` (loaded once per process)."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path} as a module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
