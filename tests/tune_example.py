"""Loads ``examples/tuned_reduction.py`` as a module (examples are not a package)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "tuned_reduction.py"


def load_example() -> ModuleType:
    """The example module (loaded once, then reused)."""
    name = "asynccube_example_tuned_reduction"
    module = sys.modules.get(name)
    if module is None:
        spec = importlib.util.spec_from_file_location(name, EXAMPLE)
        assert spec is not None
        assert spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return module
