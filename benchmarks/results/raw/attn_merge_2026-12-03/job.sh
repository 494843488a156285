#!/bin/bash
# device call 2: attn_merge beside the best plans (round checked against the reference, then timed)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $OUT/gpu.txt
t0=$(date +%s)
for w in qwen3-06b-8b-b4 qwen25-05b-7b-b8 llama-1b-8b-b8; do
  d=benchmarks/variants/knobs/$w
  timeout 170 python -m conjugate bench examples/$w.toml --evaluator benchmarks/profiles/h200_quick.toml \
    --plan benchmarks/results/plans/$w.json --plan $d/best-attn-merge-draft.json --plan $d/best-attn-merge-both.json \
    --json $OUT/merge_$w.json > $OUT/merge_$w.log 2>&1
  echo "$w rc=$? $(( $(date +%s)-t0 ))s"
done
for w in qwen3-06b-8b-b4 qwen25-05b-7b-b8 llama-1b-8b-b8; do tail -n 12 $OUT/merge_$w.log; done
