"""An experiment script (lab/experiments/NAME.py) imported as a module, for the tests of its parts that need no GPU."""
from __future__ import annotations

import importlib
import sys
from pathlib import Path

EXPERIMENTS = Path(__file__).resolve().parents[1]
BENCHMARKS = EXPERIMENTS.parents[1] / "benchmarks"


def load_script(name: str):
    """lab/experiments/<name>.py, imported by its name (some import their siblings, or a suite script of benchmarks/)."""
    for folder in (BENCHMARKS, EXPERIMENTS):
        if str(folder) not in sys.path:
            sys.path.insert(0, str(folder))
    return importlib.import_module(name)
