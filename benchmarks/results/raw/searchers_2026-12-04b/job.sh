#!/bin/bash
# one device call per workload: heuristic MCTS (merge_moves and charge_merges on) and greedy, fresh, 40 evaluations each
# usage (code d7609be): git rev-parse HEAD > .dev/commit.txt (git metadata on the device is not the checkout's), then
#   W=examples/qwen3-06b-8b-b4.toml NAME=q3 T=470 bash benchmarks/results/raw/searchers_2026-12-04b/job.sh
#   (b8: examples/llama-1b-8b-b8.toml T=400; c2k: benchmarks/workloads/llama-3b-8b-b4-ctx2k.toml T=470)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD
mkdir -p $OUT/w/F
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $OUT/gpu.txt
cp .dev/commit.txt $OUT/commit.txt
t0=$(date +%s)
python benchmarks/searchers.py $W --agents heuristic greedy --budget 40 \
  --evaluator benchmarks/profiles/h200_quick.toml --time $T --step 5 --confirm 3 --out $OUT/w/F \
  --json $OUT/$NAME.json > $OUT/$NAME.log 2>&1
echo "$NAME rc=$? $(( $(date +%s)-t0 ))s"
cd $OUT/w && tar -cJf ../${NAME}_databases.tar.xz F && cd .. && rm -rf w
tail -n 8 $NAME.log
