"""The fused norms' row statistics summed in fewer dependent steps: is that what the fused GEMMs lose?

    python lab/fused_norms/stats_block.py 256 examples/llama-1b-8b-b1.toml --streamed --pdl start \
        --fusions attn_norm+qkv qkv+rope_kv mlp_norm+gate_up --fused-tiles qkv.SPLIT_K=4 --ledger --json OUT.json

A GEMM with a fused norm reads its rows' statistics (`STATS_IN`: sums of squares of 16 columns each,
left by the residual GEMM before) in a loop of STATS_BLOCK of them a step (64) before its main loop:
at a hidden size of 4096, four dependent reads before the first weight tile. This runs
benchmarks/verify_kernels.py (its arguments after the first) with STATS_BLOCK set to the first
argument (one step at 256), in its own process (Triton compiles a module constant once), and adds
`stats_block` to its JSON. Lab code: it sets one constant of the package; nothing in `conjugate/`
imports it.
"""
from __future__ import annotations

import sys

import triton.language as tl

from conjugate.kernels import tile
from verify_run import run_verify_kernels


def main() -> int:
    n = int(sys.argv[1]) if len(sys.argv) > 1 and sys.argv[1].isdigit() else 0
    if len(sys.argv) < 3 or n < 16 or n & (n - 1):
        print("usage: stats_block.py N VERIFY_KERNELS_ARGS... (N a power of two, at least 16)", file=sys.stderr)
        return 2
    tile.STATS_BLOCK = tl.constexpr(n)
    return run_verify_kernels(sys.argv[2:], ["lab/fused_norms/stats_block.py", str(n)], {"stats_block": n})


if __name__ == "__main__":
    sys.exit(main())
