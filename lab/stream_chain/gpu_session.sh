#!/usr/bin/env bash
# Every stream_chain probe in one device call, most valuable first, each under its own time limit;
# JSONs and logs land in ${OUT:-out}/ (each JSON is rewritten after every row, so a probe cut short
# keeps what it measured). A short table of each probe is printed last.
#     bash lab/stream_chain/gpu_session.sh
set -u
out=${OUT:-out}
mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$out/gpu.txt"
run() {  # run NAME SECONDS ARGS...: one probe, its log and exit status
    local name=$1 limit=$2
    shift 2
    timeout "$limit" python "$@" > "$out/$name.log" 2>&1
    echo "$name: exit $?" >> "$out/status.txt"
}
run chain 200 lab/stream_chain/chain.py --models llama-3.2-1b qwen3-0.6b qwen2.5-0.5b --layers 1 16 \
    --batches 1 8 16 --json "$out/chain.json"
run chain_stages3 50 lab/stream_chain/chain.py --models llama-3.2-1b --layers 16 --stages 3 --batches 8
run gemm 120 lab/stream_chain/gemm.py --json "$out/gemm.json"
run attention 120 lab/stream_chain/attention.py --json "$out/attention.json"
run gluon_gemm_graph 90 lab/gluon_gemm/gemm.py --graph --json "$out/gluon_gemm_graph.json"
cat "$out/status.txt"
# the device returns at most 8 files: the logs travel as one archive
tar -czf "$out/logs.tar.gz" -C "$out" $(cd "$out" && ls *.log)
for name in chain chain_stages3 gemm attention gluon_gemm_graph; do
    echo "== $name"
    tail -n 14 "$out/$name.log"
done
rm -f "$out"/*.log
