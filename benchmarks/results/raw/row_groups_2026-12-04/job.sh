#!/bin/bash
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD
cp .dev/commit.txt $OUT/ 2>/dev/null
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $OUT/gpu.txt
for w in qwen3-06b-8b-b4 qwen25-05b-7b-b8 llama-1b-8b-b8 llama-1b-3b-b16-ctx4k; do
  timeout 200 python3 benchmarks/row_groups.py examples/$w.toml --groups 1 2 4 --json $OUT/$w.json > $OUT/$w.log 2>&1
  tail -4 $OUT/$w.log
done
