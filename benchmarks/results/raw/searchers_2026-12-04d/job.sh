#!/bin/bash
# heuristic MCTS (exploit_last 0.25) fresh on workload(s) $W, 40 evaluations; the greedy runs of
# results/raw/searchers_2026-12-04b resumed (complete: nothing to evaluate) so both best plans are confirmed in one process
# usage (code 7be5872): git rev-parse HEAD > .dev/commit.txt, then
#   W=examples/qwen3-06b-8b-b4.toml T=260 bash benchmarks/results/raw/searchers_2026-12-04d/job.sh   (b8: examples/llama-1b-8b-b8.toml T=240)
# (results/raw/searchers_2026-12-04b/databases.tar.xz holds the greedy runs resumed)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD
mkdir -p $OUT/w && tar -xJf benchmarks/results/raw/searchers_2026-12-04b/databases.tar.xz -C $OUT/w
rm -f $OUT/w/F/*_heuristic.db; ls $OUT/w/F
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $OUT/gpu.txt
cp .dev/commit.txt $OUT/commit.txt
t0=$(date +%s)
python benchmarks/searchers.py $W \
  --agents heuristic greedy --budget 40 --resume --carry-baselines \
  --evaluator benchmarks/profiles/h200_quick.toml --time $T --step 5 --confirm 3 --out $OUT/w/F \
  --json $OUT/last.json > $OUT/last.log 2>&1
echo "rc=$? $(( $(date +%s)-t0 ))s"
cd $OUT/w && tar -cJf ../last_databases.tar.xz F && cd .. && rm -rf w
tail -n 12 last.log
