#!/usr/bin/env bash
# Measure the exported best plan again beside the baselines.
set -euo pipefail
cd "$(dirname "$0")"
conjugate bench examples/llama-1b-8b-b8.toml --plan best_plan.json --evaluator h200 --json reproduced.json
