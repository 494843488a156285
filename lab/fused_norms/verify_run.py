"""benchmarks/verify_kernels.py run in this process after a lab script changed the package's kernels,
its JSON tagged with what was changed. Lab code: nothing in `conjugate/` imports it."""
from __future__ import annotations

import json
import runpy
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run_verify_kernels(args: list[str], script: list[str], tags: dict) -> int:
    """verify_kernels.py with `args`; its --json gets `tags` and a command naming `script` (the lab
    script and its own arguments). Returns its exit status."""
    sys.argv = [str(ROOT / "benchmarks" / "verify_kernels.py")] + args
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        runpy.run_path(sys.argv[0], run_name="__main__")
    except SystemExit as done:
        if done.code:
            return int(done.code) if isinstance(done.code, int) else 1
    if "--json" in args:
        out = Path(args[args.index("--json") + 1])
        data = json.loads(out.read_text())
        data |= tags | {"command": "python " + " ".join(script + args)}
        out.write_text(json.dumps(data, indent=1))
    return 0
