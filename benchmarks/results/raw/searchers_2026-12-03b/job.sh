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
# call 4 (a later session, code of 20e4885: the search proposes what 3a34b0e's did; the changes since are
# the store's Ctrl-C handling and per-launch pdl, which the heuristic does not propose)
# llama-3b-8b-b4-ctx2k's three runs of call 3 resumed to 40 evaluations, baselines carried
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $OUT/gpu.txt
mkdir -p $OUT/w && cp -r F $OUT/w/F    # F: call 3's databases
t0=$(date +%s)
python benchmarks/searchers.py benchmarks/workloads/llama-3b-8b-b4-ctx2k.toml --agents heuristic random greedy \
  --budget 40 --evaluator benchmarks/profiles/h200_quick.toml --time 480 --step 5 --confirm 3 --resume \
  --carry-baselines --out $OUT/w/F --json $OUT/c2k_resume.json > $OUT/c2k_resume.log 2>&1
echo "c2k rc=$? $(( $(date +%s)-t0 ))s"
cd $OUT/w && tar -cJf ../bundle.tar.xz F/llama-3b-8b-b4-ctx2k_* && cd .. && rm -rf w
tail -n 14 c2k_resume.log
# call 5 (the same later session and code as call 4): qwen3-06b-8b-b4's random and greedy runs, cut by call 1's
# --time at 38 and 35 evaluations, resumed to 40 (the MCTS run, complete, is only confirmed again)
mkdir -p $OUT/w && cp -r Q $OUT/w/F    # Q: call 1's databases
python benchmarks/searchers.py examples/qwen3-06b-8b-b4.toml --agents heuristic random greedy \
  --budget 40 --evaluator benchmarks/profiles/h200_quick.toml --time 330 --step 5 --confirm 3 --resume \
  --carry-baselines --out $OUT/w/F --json $OUT/q3_resume.json > $OUT/q3_resume.log 2>&1
cd $OUT/w && tar -cJf ../bundle.tar.xz F/qwen3-06b-8b-b4_* && cd .. && rm -rf w
