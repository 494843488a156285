#!/bin/bash
# device call 3: qwen3-06b-8b-b4, heuristic MCTS, random and greedy, fresh, 40 evaluations each (code of HEAD)
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
