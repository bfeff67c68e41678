"""Imports the tests share: a script of cleanrl/ by its name, and a file that is not part of a package (the tools in
benchmark/, the docs hooks, launch.py)."""

import importlib
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parents[1]


def import_script(name: str) -> ModuleType:
    """The module of cleanrl/<name>.py; `name` may end in .py."""
    return importlib.import_module(f"cleanrl.{name.removesuffix('.py')}")


def import_file(path: Path, module_name: str) -> ModuleType:
    """Imports the file at `path` as the module `module_name`, registered in sys.modules (dataclasses look their
    module up there)."""
    spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    spec.loader.exec_module(module)
    return module
