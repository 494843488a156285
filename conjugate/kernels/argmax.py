"""Greedy argmax over the vocabulary: out[r] = argmax_v logits[r, v] (first index on ties, as
torch.argmax); logits fp32 [M, V], out with a stride between rows' tokens (one column of a [B, k]
token buffer in place). One program per row, looping over V in BLOCK chunks.
"""
import triton
import triton.language as tl


@triton.jit
def first_max(best_val, best_idx, vals, start):
    """A running (max, index of its first occurrence) with one more chunk `vals` (its columns from
    `start`) folded in: strictly greater wins, so an earlier chunk keeps a tie."""
    chunk_val = tl.max(vals, axis=0)
    chunk_idx = start + tl.argmax(vals, axis=0, tie_break_left=True).to(tl.int64)
    better = chunk_val > best_val
    return tl.where(better, chunk_val, best_val), tl.where(better, chunk_idx, best_idx)


@triton.jit
def row_argmax(base, vocab, BLOCK: tl.constexpr):
    """argmax over the row at `base` (vocab fp32 values; first index on ties; 0 for a row of -inf)."""
    cols = tl.arange(0, BLOCK)  # [BLOCK]
    best_val = tl.full([], float("-inf"), tl.float32)
    best_idx = tl.full([], 0, tl.int64)
    for start in range(0, vocab, BLOCK):
        offs = start + cols
        vals = tl.load(base + offs, mask=offs < vocab, other=float("-inf")).to(tl.float32)
        best_val, best_idx = first_max(best_val, best_idx, vals, start)
    return best_idx


@triton.jit
def argmax_tile(pid, logits_ptr, out_ptr, vocab, stride_logits, stride_out, BLOCK: tl.constexpr):
    row = pid.to(tl.int64)
    token = row_argmax(logits_ptr + row * stride_logits, vocab, BLOCK)
    tl.store(out_ptr + row * stride_out, token.to(out_ptr.dtype.element_ty))
