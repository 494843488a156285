"""Which launches of a plan's round spill registers on this GPU, and how many: the round compiled and
warmed up (every kernel built by Triton for the GPU at hand; nothing timed), then each distinct kernel
with spills listed once with one of its launches' ops and counted over the round.

    python lab/experiments/launch_resources.py PLAN.json WORKLOAD.toml [...]

`compiler_rounds.py` reports only how many launches spill (`launches_with_spills`); this names them.
`python -m conjugate.compiler.offline` reports the same resources without a GPU, from Triton's own
compile for sm_90 (its spill count is local memory / 4, which can differ from the driver's).
"""
from __future__ import annotations

import argparse
import collections
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from conjugate.compiler.buffers import PreparedWeights  # noqa: E402
from conjugate.compiler.round import compile_round  # noqa: E402
from conjugate.evaluate.rounds import round_inputs  # noqa: E402
from conjugate.models import random_weights  # noqa: E402
from conjugate.plan import load_plan  # noqa: E402
from conjugate.workload import load_workload  # noqa: E402


def spilling_kernels(plan_path: Path, workload_path: Path) -> dict[tuple[str, int, int], dict]:
    """(kernel file, registers, spills) -> {"launches": how many, "ops": one launch's ops}."""
    import torch

    workload, device = load_workload(workload_path), torch.device("cuda")
    draft = random_weights(workload.draft, workload.seed, workload.torch_dtype, device)
    target = random_weights(workload.target, workload.seed, workload.torch_dtype, device)
    compiled = compile_round(load_plan(plan_path), workload, PreparedWeights(draft), PreparedWeights(target))
    compiled.load(round_inputs(workload, draft, target))
    compiled.warmup()  # builds every kernel, which fills in its registers and spills
    found: dict[tuple[str, int, int], dict] = collections.OrderedDict()
    for f in compiled.feedback():
        if f.resources.spills:
            entry = found.setdefault((f.kernel, f.resources.registers, f.resources.spills),
                                     {"launches": 0, "ops": " | ".join("+".join(p.ops) for p in f.parts)})
            entry["launches"] += 1
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("plan", type=Path)
    parser.add_argument("workloads", nargs="+", type=Path)
    args = parser.parse_args()
    for path in args.workloads:
        found = spilling_kernels(args.plan, path)
        name = load_workload(path).name
        if not found:
            print(f"{name}: no launch spills")
        for (kernel, registers, spills), e in found.items():
            print(f"{name}: {kernel} {registers} registers, {spills} spilled, {e['launches']} launches, "
                  f"e.g. {e['ops']}")


if __name__ == "__main__":
    main()
