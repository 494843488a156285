#!/usr/bin/env bash
# Measure the exported best plan again beside the baselines.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
data="$(python3 -c 'import conjugate.paths as p; print(p.DATA_ROOT)')"  # its examples/ and evaluators/
python3 -m conjugate bench "$data"/examples/llama-1b-8b-b8.toml --plan "$here/best_plan.json" --evaluator "$data"/evaluators/h200.toml --json "$here/reproduced.json"
