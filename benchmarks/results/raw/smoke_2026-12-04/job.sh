#!/bin/bash
# GPU smoke of the command paths the hostile-input changes touched (bench, profile, generate with --json)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $OUT/gpu.txt
W=examples/llama-1b-8b-b8.toml; P=benchmarks/results/plans/llama-1b-8b-b8.json
sum0=$(sha256sum $P $W | sha256sum)
t0=$(date +%s)
timeout 200 python -m conjugate bench $W --evaluator benchmarks/profiles/h200_quick.toml --plan $P --json $OUT/bench.json > $OUT/bench.log 2>&1
echo "bench rc=$? $(( $(date +%s)-t0 ))s"; tail -n 5 $OUT/bench.log
python -m conjugate bench $W --evaluator benchmarks/profiles/h200_quick.toml --plan $P --json $P > $OUT/refused.log 2>&1
echo "bench --json onto its plan rc=$? $(cat $OUT/refused.log)"
python -m conjugate profile $W --plan $P --json $W >> $OUT/refused.log 2>&1
echo "profile --json onto its workload rc=$? $(tail -n 1 $OUT/refused.log)"
[ "$(sha256sum $P $W | sha256sum)" = "$sum0" ] && echo "inputs unchanged"
t0=$(date +%s)
timeout 200 python -m conjugate profile $W --plan $P --replays 3 --json $OUT/profile.json > $OUT/profile.log 2>&1
echo "profile rc=$? $(( $(date +%s)-t0 ))s"; tail -n 4 $OUT/profile.log
t0=$(date +%s)
timeout 150 python -m conjugate generate $W --plan $P --prompt-ids 1,2,3,4 --max-new-tokens 16 --json $OUT/generate.json > $OUT/generate.log 2>&1
echo "generate rc=$? $(( $(date +%s)-t0 ))s"; tail -n 4 $OUT/generate.log
