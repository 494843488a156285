"""Token embedding lookup: x[r, :] = float32(table[tokens[r], :]); table [V, H] bf16/fp16/fp32.

Activations are fp32, row-major, one row per token r = b*T + t, with an explicit row stride. Token
ids are int64 (or int32) with a stride between consecutive rows' tokens, so a kernel can read one
column of a [B, k] token buffer in place (stride k). Grid M * cdiv(H, BLOCK): program pid copies
chunk pid % cdiv(H, BLOCK) of row pid // that.
"""
import triton
import triton.language as tl


@triton.jit
def embed_tile(pid, tokens_ptr, table_ptr, x_ptr, hidden, stride_tok, stride_table, stride_x,
               BLOCK: tl.constexpr):
    chunks = tl.cdiv(hidden, BLOCK)
    row = (pid // chunks).to(tl.int64)
    cols = (pid % chunks) * BLOCK + tl.arange(0, BLOCK)  # [BLOCK]
    mask = cols < hidden
    token = tl.load(tokens_ptr + row * stride_tok).to(tl.int64)  # scalar
    vals = tl.load(table_ptr + token * stride_table + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(x_ptr + row * stride_x + cols, vals, mask=mask)
