#!/bin/bash
# tickets with every draft tile at 2 pipeline stages (38.9 KB of shared memory a program instead of 104 KB:
# 4 programs an SM instead of 2), against the launches with the same tiles; qwen3-06b-8b-b4
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/gpu.txt
cp .dev/commit.txt $OUT/commit.txt
mkdir -p $OUT/r
w=qwen3-06b-8b-b4; V=benchmarks/variants/knobs/$w; t0=$(date +%s)
timeout 500 python -m conjugate bench examples/$w.toml --evaluator benchmarks/profiles/h200_quick.toml \
  --plan benchmarks/results/plans/$w.json --plan $V/best-draft-stages-2.json --plan $V/best-draft-tickets-layer.json \
  --plan $V/best-draft-tickets-layer-stages-2.json --plan $V/best-phases-apart.json \
  --plan $V/best-phases-apart-draft-stages-2.json --plan $V/best-phases-apart-draft-tickets-layer-stages-2.json \
  --json $OUT/r/tickets3_$w.json > $OUT/r/tickets3_$w.log 2>&1
echo "== $w rc=$? $(( $(date +%s)-t0 ))s"
grep -v "^\s*$" $OUT/r/tickets3_$w.log | tail -n 12 | cut -c1-150
cd $OUT && tar czf tickets3.tar.gz r && rm -rf r
