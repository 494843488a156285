#!/bin/bash
# three device calls, one H200, code of 3a34b0e (the search as it stood; benchmarks/moves.py came after and reads databases only)
# call 1
# qwen3-06b-8b-b4, heuristic MCTS, random and greedy, fresh, 40 evaluations each (code of 3a34b0e)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD
mkdir -p $OUT/w/F
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $OUT/gpu.txt
t0=$(date +%s)
python benchmarks/searchers.py examples/qwen3-06b-8b-b4.toml --agents heuristic random greedy --budget 40 \
  --evaluator benchmarks/profiles/h200_quick.toml --time 515 --step 5 --confirm 3 --out $OUT/w/F \
  --json $OUT/q3.json > $OUT/q3.log 2>&1
echo "q3 rc=$? $(( $(date +%s)-t0 ))s"
cd $OUT/w && tar -cJf ../bundle.tar.xz F && cd .. && rm -rf w
tail -n 12 q3.log
# call 2
# device call: llama-1b-8b-b8, heuristic MCTS, random and greedy, fresh, 40 evaluations each (code of 3a34b0e)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD
mkdir -p $OUT/w/F
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $OUT/gpu.txt
t0=$(date +%s)
python benchmarks/searchers.py examples/llama-1b-8b-b8.toml --agents heuristic random greedy --budget 40 \
  --evaluator benchmarks/profiles/h200_quick.toml --time 470 --step 5 --confirm 3 --out $OUT/w/F \
  --json $OUT/b8.json > $OUT/b8.log 2>&1
echo "b8 rc=$? $(( $(date +%s)-t0 ))s"
cd $OUT/w && tar -cJf ../bundle.tar.xz F && cd .. && rm -rf w
tail -n 12 b8.log
# call 3 (run with C2K_TIME=320: cut short, to be resumed)
# device call: llama-3b-8b-b4-ctx2k, heuristic MCTS, random and greedy, fresh, cut by --time (code of 3a34b0e);
# resumed to 40 evaluations each with --resume --carry-baselines in a later call
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD
mkdir -p $OUT/w/F
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $OUT/gpu.txt
t0=$(date +%s)
python benchmarks/searchers.py benchmarks/workloads/llama-3b-8b-b4-ctx2k.toml --agents heuristic random greedy \
  --budget 40 --evaluator benchmarks/profiles/h200_quick.toml --time ${C2K_TIME:-300} --step 5 --out $OUT/w/F \
  --json $OUT/c2k.json > $OUT/c2k.log 2>&1
echo "c2k rc=$? $(( $(date +%s)-t0 ))s"
cd $OUT/w && tar -cJf ../bundle.tar.xz F && cd .. && rm -rf w
tail -n 12 c2k.log
