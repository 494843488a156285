#!/bin/bash
# persist order `tickets`: each draft layer one ticket-ordered launch (variants of knob_variants.py),
# beside the best plan (rounds) and with the phases apart; conjugate bench checks each round first.
# usage: tickets.sh GPU WORKLOAD...   (one GPU per invocation; two invocations run side by side)
G=$1; shift
export CUDA_VISIBLE_DEVICES=$G PYTHONPATH=/tmp/site:$PWD
mkdir -p $OUT/r
for w in "$@"; do
  V=benchmarks/variants/knobs/$w; t0=$(date +%s)
  P="--plan benchmarks/results/plans/$w.json"
  for v in draft-tickets-layer draft-tickets-layer-preload draft-tickets-layer-no-prefetch draft-tickets-layer-264 \
           target-tickets-layer; do P="$P --plan $V/best-$v.json"; done
  P="$P --plan $V/best-phases-apart.json"
  for v in draft-tickets-layer draft-tickets-layer-preload; do P="$P --plan $V/best-phases-apart-$v.json"; done
  timeout 560 python -m conjugate bench examples/$w.toml --evaluator benchmarks/profiles/h200_quick.toml $P \
    --json $OUT/r/tickets_$w.json > $OUT/r/tickets_$w.log 2>&1
  echo "== $w rc=$? $(( $(date +%s)-t0 ))s"
done
