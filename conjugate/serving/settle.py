"""A group's accept step in one launch: the rules of accept.py (greedy acceptance, emitted tokens
appended, lengths and the next round's input advanced) as one Triton kernel, one program per
sequence, instead of some twenty small torch kernels between the round's CUDA graphs.

Per sequence b of the group (size B, k drafts each):
    matched = leading drafts equal to the target's tokens; counts = min(matched + 1, k)
    active  = produced[b] < limit[b]; c = counts if active else 0
    out[b, produced[b] + j] = target[b, j] for j < c; produced[b] += c
    draft and target lengths[b] += c; draft tokens_in[b] = target[b, counts - 1] if active
    accepted += (k, matched) if active            (integer atomics: the order does not matter)
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _settle(verify_in_ptr, verify_out_ptr, tokens_in_ptr, draft_len_ptr, target_len_ptr, out_ptr, produced_ptr,
            limit_ptr, accepted_ptr, out_stride, K: tl.constexpr, KP: tl.constexpr):
    b = tl.program_id(0)
    j = tl.arange(0, KP)
    row = b * (K + 1)
    target = tl.load(verify_out_ptr + row + j, mask=j < K, other=0)  # t_0..t_{k-1}
    drafts = tl.load(verify_in_ptr + row + 1 + j, mask=j < K, other=0)  # d_1..d_k
    mismatch = tl.where((drafts != target) & (j < K), j, K)
    matched = tl.min(mismatch, axis=0)  # drafts before the first mismatch
    counts = tl.minimum(matched + 1, K)
    last = tl.sum(tl.where(j == counts - 1, target, 0), axis=0)
    produced = tl.load(produced_ptr + b)
    active = produced < tl.load(limit_ptr + b)
    c = tl.where(active, counts, 0)
    tl.store(out_ptr + b * out_stride + produced + j, target, mask=j < c)
    tl.store(produced_ptr + b, produced + c)
    tl.store(draft_len_ptr + b, tl.load(draft_len_ptr + b) + c)
    tl.store(target_len_ptr + b, tl.load(target_len_ptr + b) + c)
    tl.store(tokens_in_ptr + b, tl.where(active, last, tl.load(tokens_in_ptr + b)))
    tl.atomic_add(accepted_ptr, tl.where(active, K, 0).to(tl.int64))
    tl.atomic_add(accepted_ptr + 1, tl.where(active, matched, 0).to(tl.int64))


def settle(verify_in: torch.Tensor, verify_out: torch.Tensor, tokens_in: torch.Tensor, draft_lengths: torch.Tensor,
           target_lengths: torch.Tensor, out: torch.Tensor, produced: torch.Tensor, limit: torch.Tensor,
           accepted: torch.Tensor) -> None:
    """verify_in/verify_out [B, k + 1] int64 (the target's input [last, d_1..d_k] and its greedy
    tokens); tokens_in, draft/target lengths, produced, limit [B] int64 (views of the group's rows);
    out [B, width] int64 (rows contiguous); accepted [2] int64. Updated in place, no host sync."""
    b, k1 = verify_in.shape
    for name, t in (("verify_in", verify_in), ("verify_out", verify_out)):
        if t.stride() != (k1, 1):
            raise ValueError(f"{name} must hold its [{b}, {k1}] rows contiguously")
    if out.stride(1) != 1:
        raise ValueError("out's rows must be contiguous")
    for name, t in (("tokens_in", tokens_in), ("draft_lengths", draft_lengths), ("target_lengths", target_lengths),
                    ("produced", produced), ("limit", limit), ("accepted", accepted)):
        if t.dim() != 1 or t.stride(0) != 1:
            raise ValueError(f"{name} must be one contiguous vector")
    k = k1 - 1
    _settle[(b,)](verify_in, verify_out, tokens_in, draft_lengths, target_lengths, out, produced, limit, accepted,
                  out.stride(0), K=k, KP=triton.next_power_of_2(k), num_warps=1)


def warm_settle(k: int, device: torch.device) -> None:
    """Compile the kernel for this k ahead (on one inactive row of scratch tensors), so that the first
    round of a timed loop does not pay for it."""
    z = torch.zeros(1, dtype=torch.int64, device=device)
    rows = torch.zeros(1, k + 1, dtype=torch.int64, device=device)
    settle(rows, rows.clone(), z.clone(), z.clone(), z.clone(), torch.zeros(1, k + 1, dtype=torch.int64, device=device),
           z.clone(), z.clone(), torch.zeros(2, dtype=torch.int64, device=device))
