"""Keep the conventional variants chosen by an earlier `baselines.py` run as this machine's choice,
so a later process builds only the chosen variant per phase instead of trying every variant again
(evaluate/baselines/measure.py: `chosen_variants` reads the kept choice first).

    python lab/experiments/seed_choices.py benchmarks/results/baselines_h200.json [--evaluator h200]

Only when the earlier run was measured on a GPU of this name with this torch version, tried every
variant the profile lists (and chose among them) and chose the pair for two streams; a choice already
kept is left alone. (Rows written before `baselines.py` chose the pair for two streams seed nothing.) Where the choice is kept: $CONJUGATE_CACHE/kernels/conventional/ (default
~/.cache/conjugate/kernels/conventional/), as evaluate/baselines/measure.py keeps it.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from conjugate.evaluate.baselines.measure import choice_file, keep_choice  # noqa: E402
from conjugate.evaluate.evaluators import load_profile  # noqa: E402
from conjugate.workload import load_workload  # noqa: E402


def seed(results: Path, evaluator: str) -> list[str]:
    data = json.loads(results.read_text())
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "triton-interpreter"
    if data["gpu"] != device or data["torch"] != torch.__version__:
        raise SystemExit(f"{results}: measured on {data['gpu']} with torch {data['torch']}; this is {device} "
                         f"with torch {torch.__version__}: choose again instead")
    timing, kept = load_profile(evaluator).timing, []
    for row in data["workloads"]:
        found = [d / f"{row['workload']}.toml" for d in (ROOT / "examples", ROOT / "benchmarks" / "workloads")]
        workload = load_workload(next((f for f in found if f.exists()), found[0]))
        path = choice_file(workload, device, timing, None)
        tried = {t["variant"] for t in row.get("trials", [])}
        pair = row.get("streams_variants")
        chosen = row["variants"] | ({"streams_draft": pair["draft"], "streams_verify": pair["verify"]} if pair else {})
        if (tried >= set(timing.conventional) and pair and set(chosen.values()) <= set(timing.conventional)
                and not path.exists()):  # chosen from every variant this profile lists, among them
            keep_choice(path, chosen, workload.name, row["trials"], row.get("streams_pairs_ms", {}))
            kept.append(f"{workload.name}: draft {chosen['draft']}, verify {chosen['verify']}, two streams "
                        f"{pair['draft']} / {pair['verify']}")
    return kept


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", type=Path)
    parser.add_argument("--evaluator", default="h200")
    args = parser.parse_args()
    for line in seed(args.results, args.evaluator):
        print("kept", line)


if __name__ == "__main__":
    main()
