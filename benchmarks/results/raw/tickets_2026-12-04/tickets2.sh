#!/bin/bash
# persist order `tickets` on qwen25-05b-7b-b8 and llama-1b-8b-b8 (fewer variants than tickets.sh),
# and on every workload given the draft's tickets on 48 SMs
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/gpu.txt
cp .dev/commit.txt $OUT/commit.txt
mkdir -p $OUT/r
for w in qwen25-05b-7b-b8 llama-1b-8b-b8; do
  V=benchmarks/variants/knobs/$w; t0=$(date +%s)
  P="--plan benchmarks/results/plans/$w.json"
  for v in draft-tickets-layer draft-tickets-layer-preload draft-tickets-layer-sms-48 target-tickets-layer; do P="$P --plan $V/best-$v.json"; done
  P="$P --plan $V/best-phases-apart.json --plan $V/best-phases-apart-draft-tickets-layer.json"
  timeout 270 python -m conjugate bench examples/$w.toml --evaluator benchmarks/profiles/h200_quick.toml $P \
    --json $OUT/r/tickets_$w.json > $OUT/r/tickets_$w.log 2>&1
  echo "== $w rc=$? $(( $(date +%s)-t0 ))s"
done
for f in $OUT/r/*.log; do echo "## $f"; grep -v "^\s*$" $f | tail -n 11 | cut -c1-150; done
cd $OUT && tar czf tickets2.tar.gz r && rm -rf r
