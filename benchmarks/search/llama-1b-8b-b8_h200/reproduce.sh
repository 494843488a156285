#!/usr/bin/env bash
# Measure the exported best plan again beside the baselines.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
cd "$(python3 -c 'import conjugate.workload as w; print(w.REPO_ROOT)')"
conjugate bench examples/llama-1b-8b-b8.toml --plan "$here/best_plan.json" --evaluator evaluators/h200.toml --json "$here/reproduced.json"
