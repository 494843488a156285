"""A benchmark script (benchmarks/NAME.py) loaded as a module, for the tests of its parts that need no GPU, or run
as a program in this process."""
from __future__ import annotations

import contextlib
import importlib.util
import io
import runpy
import subprocess
import sys
import traceback
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def load_script(name: str):
    """benchmarks/<name>.py as a module (benchmarks/ on sys.path: some scripts import their siblings)."""
    if str(BENCHMARKS) not in sys.path:
        sys.path.insert(0, str(BENCHMARKS))
    spec = importlib.util.spec_from_file_location(f"benchmark_{name}", BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is made
    spec.loader.exec_module(module)
    return module


def run_script(name: str, *args) -> subprocess.CompletedProcess:
    """`python benchmarks/<name>.py ARGS` in this process, as the program runs (as __main__, its folder
    first on sys.path), without starting Python and importing torch again: its exit status as Python
    gives it (a SystemExit message on stderr and status 1; a traceback and status 1), stdout and stderr."""
    path = BENCHMARKS / f"{name}.py"
    argv, path0 = sys.argv, sys.path[0]
    sys.argv, sys.path[0] = [str(path), *map(str, args)], str(BENCHMARKS)
    out, err = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                runpy.run_path(str(path), run_name="__main__")
                code = 0
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else 0 if e.code is None else 1
                if not isinstance(e.code, (int, type(None))):
                    print(e.code, file=sys.stderr)
            except Exception:  # noqa: BLE001  (as Python reports an uncaught one)
                traceback.print_exc()
                code = 1
    finally:
        sys.argv, sys.path[0] = argv, path0
    return subprocess.CompletedProcess([sys.executable, str(path), *map(str, args)], code, out.getvalue(),
                                       err.getvalue())
