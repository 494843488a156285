#!/bin/bash
# device call 1: barrier cost, then three floor searches resumed (baselines carried)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD
mkdir -p $OUT/w && tar -C $OUT/w -xJf .dev/dbs.tar.xz
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $OUT/gpu.txt
git log -1 --format=%h > $OUT/code.txt 2>/dev/null
t0=$(date +%s)
timeout 90 python benchmarks/barrier_cost.py --json $OUT/barrier_cost.json > $OUT/barrier.log 2>&1; echo "barrier rc=$? $(( $(date +%s)-t0 ))s"
timeout 170 python benchmarks/searchers.py examples/qwen3-06b-8b-b4.toml --agents heuristic --budget 120 --evaluator benchmarks/profiles/h200_quick.toml --time 140 --resume --carry-baselines --out $OUT/w/S --json $OUT/q3.json > $OUT/q3.log 2>&1; echo "q3 rc=$? $(( $(date +%s)-t0 ))s"
timeout 170 python benchmarks/searchers.py examples/qwen25-05b-7b-b8.toml --agents heuristic --budget 140 --evaluator h200 --time 140 --resume --carry-baselines --out $OUT/w/F --json $OUT/q25.json > $OUT/q25.log 2>&1; echo "q25 rc=$? $(( $(date +%s)-t0 ))s"
left=$(( 575 - ($(date +%s)-t0) ))
timeout $left python benchmarks/searchers.py examples/llama-1b-8b-b8.toml --agents heuristic --budget 100 --evaluator benchmarks/profiles/h200_quick.toml --time $(( left - 25 )) --resume --carry-baselines --out $OUT/w/S --json $OUT/b8.json > $OUT/b8.log 2>&1; echo "b8 rc=$? $(( $(date +%s)-t0 ))s"
cd $OUT && tar -cJf bundle.tar.xz w *.log *.json gpu.txt code.txt 2>/dev/null; rm -rf w
ls -la $OUT
for f in q3 q25 b8; do tail -n 4 $f.log; done; tail -n 15 barrier.log
