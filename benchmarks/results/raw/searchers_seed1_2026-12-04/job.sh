#!/bin/bash
# one device call per workload: heuristic MCTS (the search as shipped) and greedy, fresh, seed 1, 40 evaluations each
# usage (code in commit.txt): W=benchmarks/workloads/llama-3b-8b-b4-ctx2k.toml NAME=c2k T=470 bash job.sh
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD
mkdir -p $OUT/w/F
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $OUT/gpu.txt
cp .dev/commit.txt $OUT/commit.txt
t0=$(date +%s)
python benchmarks/searchers.py $W --agents heuristic greedy --budget 40 --seed 1 \
  --evaluator benchmarks/profiles/h200_quick.toml --time $T --step 5 --confirm 3 --out $OUT/w/F \
  --json $OUT/$NAME.json > $OUT/$NAME.log 2>&1
echo "$NAME rc=$? $(( $(date +%s)-t0 ))s"
cd $OUT/w && tar -cJf ../${NAME}_databases.tar.xz F && cd .. && rm -rf w
tail -n 8 $NAME.log
