#!/bin/bash
# persist.preload: each draft layer one persistent launch, with and without the GEMM parts' preload,
# beside the best plan (rounds) and with the phases apart (conjugate bench, checked first)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD
mkdir -p $OUT/r
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
for w in "$@"; do
  V=benchmarks/variants/knobs/$w; t0=$(date +%s)
  timeout 170 python -m conjugate bench examples/$w.toml --evaluator benchmarks/profiles/h200_quick.toml \
    --plan benchmarks/results/plans/$w.json --plan $V/best-draft-persist-layer.json --plan $V/best-draft-persist-layer-preload.json \
    --plan $V/best-phases-apart.json --plan $V/best-phases-apart-draft-persist-layer.json \
    --plan $V/best-phases-apart-draft-persist-layer-preload.json \
    --json $OUT/r/persist_$w.json > $OUT/r/persist_$w.log 2>&1
  echo "== $w rc=$? $(( $(date +%s)-t0 ))s"; tail -n 10 $OUT/r/persist_$w.log | cut -c1-140
done
cd $OUT && tar czf persist_preload.tar.gz r && rm -rf r
