#!/bin/bash
# fused MLP (gate_up+down): kernels alone against the separate launches, then rounds: best plans +/- the fusion
ROOT=$PWD; mkdir -p $OUT/k; S=/tmp/site
EX="examples/llama-1b-8b-b1.toml examples/llama-1b-8b-b8.toml examples/qwen25-05b-7b-b8.toml examples/llama-1b-3b-b16-ctx4k.toml examples/qwen3-06b-8b-b4.toml examples/qwen25-15b-14b-b4.toml"
run() { local name=$1 secs=$2; shift 2; local t=$(date +%s); timeout --signal=INT --kill-after=15 $secs "$@" > $OUT/k/$name.log 2>&1; echo "$name rc=$? $(( $(date +%s) - t ))s" | tee -a $OUT/k/summary.txt; }
export PYTHONPATH=$S:$ROOT
run gpu_tests 50 python -m pytest -q -n 0 -p no:cacheprovider tests/test_mlp.py tests/test_gemm.py -k "gpu or copies"
run sweep 140 python benchmarks/kernel_sweep.py $EX --kinds gate_up down mlp --models draft --per-shape 24 --prewarm 14 --json $OUT/k/sweep_mlp.json
for w in qwen3-06b-8b-b4 qwen25-05b-7b-b8; do
  python benchmarks/knob_variants.py benchmarks/results/plans/$w.json $OUT/k/v/$w --name best > /dev/null 2>&1
  V=""; for v in draft-mlp draft-fusions draft-fusions-no-mlp; do [ -f $OUT/k/v/$w/best-$v.json ] && V="$V --plan $OUT/k/v/$w/best-$v.json"; done
  run bench_$w 150 python -m conjugate bench examples/$w.toml --evaluator benchmarks/profiles/h200_quick.toml --plan benchmarks/results/plans/$w.json $V --json $OUT/k/bench_$w.json
done
for f in $OUT/k/*.log; do echo "== $f"; tail -14 $f; done; cat $OUT/k/summary.txt
