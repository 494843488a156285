#!/bin/bash
# usage: tickets_main.sh WORKLOAD...  (one GPU; .dev/tickets.sh per workload)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/gpu.txt
cp .dev/commit.txt $OUT/commit.txt
bash .dev/tickets.sh 0 "$@" 2>&1 | tee $OUT/g0.txt
for f in $OUT/r/*.log; do echo "## $f"; grep -v "^\s*$" $f | tail -n 14 | cut -c1-160; done
cd $OUT && tar czf tickets_$1.tar.gz r g0.txt && rm -rf r
