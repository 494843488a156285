"""Normalisation family: RMSNorm over the hidden dimension.

Layout. x (fp32) and out (fp32 or the weights' type) are [M, H], row-major with their own row
strides (rows r = b*T + t);
weight is [H] in any float dtype, upcast to fp32 after the load. One program per row makes two
passes over H in BLOCK chunks: the sum of squares, then out = x * rsqrt(mean(x^2) + eps) * w,
the order of reference.rms_norm.
"""
import triton
import triton.language as tl


@triton.jit
def rmsnorm_tile(pid, x_ptr, w_ptr, out_ptr, hidden, stride_x, stride_out, eps, BLOCK: tl.constexpr):
    row = pid.to(tl.int64)
    x_row = x_ptr + row * stride_x
    out_row = out_ptr + row * stride_out
    cols = tl.arange(0, BLOCK)  # [BLOCK]
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for start in range(0, hidden, BLOCK):
        x = tl.load(x_row + start + cols, mask=start + cols < hidden, other=0.0).to(tl.float32)
        acc += x * x
    rstd = tl.rsqrt(tl.sum(acc, axis=0) / hidden + eps)  # scalar
    for start in range(0, hidden, BLOCK):
        mask = start + cols < hidden
        x = tl.load(x_row + start + cols, mask=mask, other=0.0).to(tl.float32)
        w = tl.load(w_ptr + start + cols, mask=mask, other=0.0).to(tl.float32)
        tl.store(out_row + start + cols, (x * rstd * w).to(out_ptr.dtype.element_ty), mask=mask)
