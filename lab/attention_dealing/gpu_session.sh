#!/bin/bash
# One GPU call (under 600 s): the attention dealing comparison, then the Gluon GEMM's two-warpgroup
# 128 x 256 tile and its BLOCK_K 128 form, each beside cuBLAS. JSONs and logs into $OUT.
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader | tee "$OUT/gpu.txt"
timeout 280 python lab/attention_dealing/compare.py --json "$OUT/attention_dealing.json" 2>&1 | tee "$OUT/attention_dealing.log" | tail -100
timeout 130 python lab/gluon_gemm/gemm.py --graph --block-n 256 --warps-128 8 --json "$OUT/gluon_bn256_w8.json" 2>&1 | tee "$OUT/gluon_bn256_w8.log"
timeout 130 python lab/gluon_gemm/gemm.py --graph --ws --block-k 128 --json "$OUT/gluon_bk128.json" 2>&1 | tee "$OUT/gluon_bk128.log"
