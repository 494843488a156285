"""The kernels lab/cluster_reduce/probe.py compiles for sm_90a, one case a process:
`python lab/cluster_reduce/kernels.py CASE` prints what the PTX holds, or fails as Triton does."""
from __future__ import annotations

import sys

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from conjugate.compiler.offline import _Triton


@gluon.jit
def cluster_barrier(out_ptr, LAYOUT: gl.constexpr):
    i = gl.arange(0, 128, layout=LAYOUT)
    rank = gl.inline_asm_elementwise("mov.u32 $0, %cluster_ctarank;", "=r,r", [i], dtype=gl.int32, is_pure=False,
                                     pack=1)
    done = gl.inline_asm_elementwise("barrier.cluster.arrive.release.aligned; barrier.cluster.wait.acquire.aligned; "
                                     "mov.u32 $0, 0;", "=r,r", [i], dtype=gl.int32, is_pure=False, pack=1)
    gl.store(out_ptr + gl.program_id(0) * 128 + i, rank + done)


@gluon.jit
def cross_reduce(x_ptr, out_ptr, SPLIT: gl.constexpr):
    r = gl.arange(0, 2, layout=gl.SliceLayout(1, SPLIT))
    c = gl.arange(0, 128, layout=gl.SliceLayout(0, SPLIT))
    x = gl.load(x_ptr + r[:, None] * 128 + c[None, :])  # row r on CTA r: two pieces of one tile
    gl.store(out_ptr + c, gl.sum(x, axis=0))


@gluon.jit
def cross_exchange(x_ptr, out_ptr, SPLIT: gl.constexpr, WHOLE: gl.constexpr):
    r = gl.arange(0, 2, layout=gl.SliceLayout(1, SPLIT))
    c = gl.arange(0, 128, layout=gl.SliceLayout(0, SPLIT))
    x = gl.convert_layout(gl.load(x_ptr + r[:, None] * 128 + c[None, :]), WHOLE)  # both rows on both CTAs
    gl.store(out_ptr + gl.arange(0, 128, layout=gl.SliceLayout(0, WHOLE)), gl.sum(x, axis=0))


def blocked(cga):
    return gl.BlockedLayout([1, 1], [1, 32], [1, 4], [1, 0], cga_layout=cga)


def main(case: str) -> None:
    tools = _Triton(90)
    x = torch.empty(256, dtype=torch.float32, device="meta")
    out = torch.empty(256, dtype=torch.float32, device="meta")
    if case == "cluster":
        kernel, args, kw = cluster_barrier, (out,), {"LAYOUT": gl.BlockedLayout([1], [32], [4], [0], cga_layout=[[0]])}
    elif case == "reduce":
        kernel, args, kw = cross_reduce, (x, out), {"SPLIT": blocked([[1, 0]])}
    elif case == "exchange":
        kernel, args, kw = cross_exchange, (x, out), {"SPLIT": blocked([[1, 0]]), "WHOLE": blocked([[0, 0]])}
    else:
        kernel, args, kw = cross_exchange, (x, out), {"SPLIT": blocked([]), "WHOLE": blocked([])}
    ctas = 1 if case == "single" else 2
    _, (source, options) = tools.bind_gluon(kernel, args, {"num_warps": 4, "num_ctas": ctas, **kw}, case)
    ptx = tools.triton.compile(source, target=tools.target, options=options).asm["ptx"]
    print("PTX:", " | ".join(sorted({w for w in (".explicitcluster", ".reqnctapercluster 2", "barrier.cluster",
                                                  "%cluster_ctarank", "mapa", "shared::cluster") if w in ptx})))


if __name__ == "__main__":
    main(sys.argv[1])
