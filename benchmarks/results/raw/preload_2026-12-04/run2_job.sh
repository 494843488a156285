#!/bin/bash
# PDL preload, one BLOCK_K step: the chain, and the best plans' variants, in rounds and with the phases apart
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
chain() {  # name, args...
  n=$1; shift
  timeout 120 python benchmarks/dataflow_chain.py "$@" --json $OUT/$n.json > $OUT/$n.log 2>&1
  echo "== $n rc=$?"; grep -E "^(launches|4 streams|floor)" $OUT/$n.log
}
bench() {  # workload
  w=$1; V=benchmarks/variants/knobs/$w; t0=$(date +%s)
  timeout 200 python -m conjugate bench examples/$w.toml --evaluator benchmarks/profiles/h200_quick.toml \
    --plan benchmarks/results/plans/$w.json --plan $V/best-pdl-draft-start-preload.json --plan $V/best-pdl-draft-end-preload.json \
    --plan $V/best-phases-apart.json --plan $V/best-phases-apart-pdl-draft-start.json \
    --plan $V/best-phases-apart-pdl-draft-start-preload.json --plan $V/best-phases-apart-pdl-draft-end-preload.json \
    --json $OUT/preload_$w.json > $OUT/preload_$w.log 2>&1
  echo "== $w rc=$? $(( $(date +%s)-t0 ))s"; tail -n 11 $OUT/preload_$w.log
}
chain chain_1024_64_128_8 --dim 1024 --rows 4 --layers 64 --split 4 --warps 4 --streams 4 --launch-tile 64 128 8
chain chain_1024_32_128_4 --dim 1024 --rows 4 --layers 64 --split 4 --warps 4 --streams 4 --launch-tile 32 128 4
chain chain_2048_16_512_1 --dim 2048 --rows 8 --layers 32 --split 2 --warps 4 --streams 4 --launch-tile 16 512 1
for w in "$@"; do bench $w; done
