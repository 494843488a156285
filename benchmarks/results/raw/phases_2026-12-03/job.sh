#!/bin/bash
# device call: each best plan's phases apart (knob_variants.py phases-apart), profiled, from a clean snapshot of HEAD
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
cd .dev/clean && export PYTHONPATH=/tmp/site:$PWD
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $OUT/gpu.txt
for w in qwen3-06b-8b-b4 qwen25-05b-7b-b8 llama-1b-8b-b8 llama-1b-8b-b1 llama-1b-3b-b16-ctx4k qwen25-15b-14b-b4; do
  t0=$(date +%s)
  timeout 120 python -m conjugate profile examples/$w.toml --plan benchmarks/variants/knobs/$w/best-phases-apart.json \
    --json $OUT/apart_$w.json > $OUT/apart_$w.log 2>&1
  echo "$w rc=$? $(( $(date +%s)-t0 ))s"; tail -n 7 $OUT/apart_$w.log
done
