"""What the tall forms compile to for sm_90a, no GPU needed (Triton 3.6's compiler and bundled ptxas,
as `python -m conjugate.compiler.offline` uses them): per form, the product template's kernel at the
compute sweep's tall tiles (registers, local memory, shared memory) and tall_gemm's (its TMA loads,
wgmma shapes and shared memory). Backs the offline figures of README.md and the session notes.

    python lab/tall_gemm/offline.py

Lab code: nothing in `conjugate/` imports it.
"""
from __future__ import annotations

import os
import re
import sys
import tempfile
from pathlib import Path

os.environ["TRITON_INTERPRET"] = "0"  # the compiler, not the interpreter: before triton is imported
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))
sys.path.insert(0, str(HERE))

TEMPLATE_TILES = ((64, 64, 64, 2, 4, 3), (128, 128, 64, 1, 8, 3), (128, 256, 64, 2, 8, 3))  # M, N, K, split, warps, stages
TALL_FORMS = ((128, 128, 64, 8, 3), (128, 128, 64, 8, 4), (128, 256, 64, 8, 3))  # M, N, K, warps, stages
DOWN = (512, 3072, 8192)  # rows, N, K: a 512-row down projection of the compute sweep


def template_rows(tools) -> list[str]:
    import torch

    from conjugate.compiler.cache import KernelCache
    from conjugate.compiler.gemm import gemm_call
    from conjugate.compiler.round import CompiledLaunch

    rows, n, k = DOWN
    out = []
    with tempfile.TemporaryDirectory(prefix="tall-offline-") as tmp:
        for bm, bn, bk, split, warps, stages in TEMPLATE_TILES:
            x, w = torch.zeros(rows, k, dtype=torch.bfloat16), torch.zeros(n, k, dtype=torch.bfloat16)
            call = gemm_call(x, w, torch.zeros(rows, n), rows=rows, epilogue="residual", block_m=bm, block_n=bn,
                             block_k=bk, split_k=split)
            launch = CompiledLaunch.alone(0, call, KernelCache(Path(tmp)), num_warps=warps, num_stages=stages)
            _, (source, options) = tools.bind(launch)
            used = tools.compile(source, options)
            out.append(f"template {bm}x{bn}x{bk} split {split}, {warps} warps, {stages} stages: {used.registers} registers, "
                       f"{used.spills * 4} bytes of local memory, {used.shared_bytes} bytes shared")
    return out


def tall_rows() -> list[str]:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from gemm import tall_gemm

    out = []
    for bm, bn, bk, warps, stages in TALL_FORMS:
        signature = {"x_desc": f"tensordesc<bf16[{bm},{bk}]>", "w_desc": f"tensordesc<bf16[{bn},{bk}]>",
                     "out_ptr": "*fp32", "M": "i32", "N": "i32", "K": "i32", "stride_out": "i32"}
        constexprs = {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": 8, "PROGRAMS": 132,
                      "DOT_DTYPE": triton.language.bfloat16}
        signature |= dict.fromkeys(constexprs, "constexpr")
        compiled = triton.compile(ASTSource(tall_gemm, signature, constexprs=constexprs),
                                  target=GPUTarget("cuda", 90, 32), options={"num_warps": warps, "num_stages": stages})
        ptx = compiled.asm["ptx"]
        shapes = sorted(set(re.findall(r"wgmma\.mma_async\.sync\.aligned\.(m\d+n\d+k\d+)", ptx)))
        out.append(f"tall_gemm {bm}x{bn}x{bk}, {warps} warps, {stages} stages: {ptx.count('cp.async.bulk.tensor')} "
                   f"TMA loads, wgmma {', '.join(shapes) or 'none'}, {compiled.metadata.shared} bytes shared")
    return out


def main() -> int:
    from conjugate.compiler.offline import _Triton
    from conjugate.errors import ConjugateError

    try:
        tools = _Triton(90)
    except ConjugateError as error:
        print(f"offline.py: {error}", file=sys.stderr)
        return 2
    print("\n".join(template_rows(tools) + tall_rows()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
