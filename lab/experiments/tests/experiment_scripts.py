"""An experiment script (lab/experiments/NAME.py) loaded as a module, for the tests of its parts that need no GPU."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

EXPERIMENTS = Path(__file__).resolve().parents[1]
BENCHMARKS = EXPERIMENTS.parents[1] / "benchmarks"


def load_script(name: str):
    """lab/experiments/<name>.py as a module (some import their siblings, or a suite script of benchmarks/)."""
    for folder in (BENCHMARKS, EXPERIMENTS):
        if str(folder) not in sys.path:
            sys.path.insert(0, str(folder))
    spec = importlib.util.spec_from_file_location(f"experiment_{name}", EXPERIMENTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is made
    spec.loader.exec_module(module)
    return module
