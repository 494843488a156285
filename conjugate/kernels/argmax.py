"""Greedy argmax over the vocabulary: out[r] = argmax_v logits[r, v] (first index on ties, as
torch.argmax); logits fp32 [M, V], out with a stride between rows' tokens (one column of a [B, k]
token buffer in place). One program per row, looping over V in BLOCK chunks.
"""
import triton
import triton.language as tl


@triton.jit
def argmax_tile(pid, logits_ptr, out_ptr, vocab, stride_logits, stride_out, BLOCK: tl.constexpr):
    row = pid.to(tl.int64)
    base = logits_ptr + row * stride_logits
    cols = tl.arange(0, BLOCK)  # [BLOCK]
    vals = tl.load(base + cols, mask=cols < vocab, other=float("-inf")).to(tl.float32)
    best_val = tl.max(vals, axis=0)  # scalar
    best_idx = tl.argmax(vals, axis=0, tie_break_left=True).to(tl.int64)
    for start in range(BLOCK, vocab, BLOCK):
        offs = start + cols
        vals = tl.load(base + offs, mask=offs < vocab, other=float("-inf")).to(tl.float32)
        chunk_val = tl.max(vals, axis=0)
        chunk_idx = start + tl.argmax(vals, axis=0, tie_break_left=True).to(tl.int64)
        better = chunk_val > best_val  # strictly: an earlier chunk keeps a tie
        best_idx = tl.where(better, chunk_idx, best_idx)
        best_val = tl.where(better, chunk_val, best_val)
    tl.store(out_ptr + row * stride_out, best_idx.to(out_ptr.dtype.element_ty))
