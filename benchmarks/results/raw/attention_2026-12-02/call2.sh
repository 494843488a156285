#!/bin/bash
ROOT=$PWD; mkdir -p $OUT/k; S=/tmp/site
EX="examples/llama-1b-8b-b1.toml examples/llama-1b-8b-b8.toml examples/qwen25-05b-7b-b8.toml examples/llama-1b-3b-b16-ctx4k.toml examples/qwen3-06b-8b-b4.toml examples/qwen25-15b-14b-b4.toml"
run() { local name=$1 secs=$2; shift 2; local t=$(date +%s); timeout --signal=INT --kill-after=15 $secs "$@" > $OUT/k/$name.log 2>&1; echo "$name rc=$? $(( $(date +%s) - t ))s" | tee -a $OUT/k/summary.txt; }
PLANS="--plan streams --plan $ROOT/benchmarks/results/plans/qwen3-06b-8b-b4.json --evaluator $ROOT/benchmarks/profiles/h200_quick.toml"
PYTHONPATH=$S:$ROOT run sweep_v3 100 python benchmarks/kernel_sweep.py $EX --kinds attn --per-shape 4 --prewarm 14 --json $OUT/k/sweep_v3.json
(cd .dev/old && PYTHONPATH=$S:$ROOT/.dev/old run bench_old 90 python -m conjugate bench examples/qwen3-06b-8b-b4.toml $PLANS --json $OUT/k/bench_old.json)
PYTHONPATH=$S:$ROOT run bench_v3 90 python -m conjugate bench examples/qwen3-06b-8b-b4.toml $PLANS --json $OUT/k/bench_v3.json
for f in $OUT/k/*.log; do echo "== $f"; tail -14 $f | grep -v "━\|┃\|┏\|└"; done; cat $OUT/k/summary.txt
