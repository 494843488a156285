#!/bin/bash
# Each example's best plan (results/plans/W.json) timed beside the built baselines (conventional,
# sequential, streams) in one process, with today's code: `conjugate bench` with evaluators/h200.toml
# checks each round against the reference first.  usage: confirm.sh WORKLOAD...
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
mkdir -p $OUT/r
python benchmarks/seed_choices.py benchmarks/results/baselines_h200.json --evaluator evaluators/h200.toml > $OUT/r/seed.log 2>&1 || { cat $OUT/r/seed.log; exit 1; }
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv,noheader > $OUT/r/gpu.txt
for w in "$@"; do
  t0=$(date +%s)
  timeout 285 python -m conjugate bench examples/$w.toml --evaluator evaluators/h200.toml \
    --plan benchmarks/results/plans/$w.json --json $OUT/r/confirm_$w.json > $OUT/r/confirm_$w.log 2>&1
  echo "== $w rc=$? $(( $(date +%s)-t0 ))s"; tail -12 $OUT/r/confirm_$w.log
done
