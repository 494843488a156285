#!/bin/bash
# device call 2: per-launch pdl variants beside each best plan, one bench per workload
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $OUT/gpu.txt
for w in qwen3-06b-8b-b4 llama-1b-8b-b8 qwen25-05b-7b-b8; do
  t0=$(date +%s)
  timeout 190 python -m conjugate bench examples/$w.toml --evaluator benchmarks/profiles/h200_quick.toml \
    --plan benchmarks/results/plans/$w.json $(for f in benchmarks/variants/knobs/$w/best-{draft-attn-early,draft-attn-prefetch,draft-oproj-early,target-attn-early}.json; do printf -- '--plan %s ' $f; done) \
    --json $OUT/pdl_$w.json > $OUT/pdl_$w.log 2>&1
  echo "$w rc=$? $(( $(date +%s)-t0 ))s"
  tail -n 9 $OUT/pdl_$w.log
done
