"""Which kernels cuBLAS runs for the verify-phase projections (their names carry tile, stages, cluster
and split-K), and how long each takes, from torch.profiler: what the Gluon GEMM has to match.

    python lab/gluon_gemm/cublas_kernels.py --json OUT.json    # a GPU
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

# (model, proj, N, K) at the verify rows; the draft's at its decode rows
SHAPES = [("llama-3.1-8b", "qkv", 6144, 4096), ("llama-3.1-8b", "o_proj", 4096, 4096),
          ("llama-3.1-8b", "gate_up", 28672, 4096), ("llama-3.1-8b", "down", 4096, 14336),
          ("llama-3.2-1b", "qkv", 3072, 2048), ("llama-3.2-1b", "o_proj", 2048, 2048),
          ("llama-3.2-1b", "gate_up", 16384, 2048), ("llama-3.2-1b", "down", 2048, 8192)]
ROWS = {"llama-3.1-8b": (16, 32, 64, 96, 128), "llama-3.2-1b": (8, 16, 32)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    rows = []
    for model, proj, n, k in SHAPES:
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
        for m in ROWS[model]:
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
            for _ in range(3):
                torch.mm(x, w.T, out=out)
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(5):
                    torch.mm(x, w.T, out=out)
                torch.cuda.synchronize()
            kernels = {}
            for e in prof.events():
                if e.device_type == torch.autograd.DeviceType.CUDA:
                    kernels.setdefault(e.name, []).append(e.device_time)
            found = [{"kernel": name, "calls": len(t), "us_median": sorted(t)[len(t) // 2]} for name, t in kernels.items()]
            rows.append({"model": model, "proj": proj, "rows": m, "n": n, "k": k, "kernels": found})
            for f in found:
                print(f"{model:13} {proj:8} {m:4d}  {f['us_median']:7.1f} us x{f['calls'] // 5}  {f['kernel'][:150]}",
                      flush=True)
    if args.json:
        args.json.write_text(json.dumps({"gpu": torch.cuda.get_device_name(),
                                         "command": " ".join(["python"] + sys.argv), "torch": torch.__version__,
                                         "cuda": torch.version.cuda, "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
