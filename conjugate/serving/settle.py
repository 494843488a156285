"""A group's accept step in one launch: the rules of accept.py (greedy acceptance or speculative
sampling, emitted tokens appended, lengths and the next round's input advanced) as one
Triton kernel, one program per sequence, instead of some twenty small torch kernels between the
round's CUDA graphs.

Per sequence b of the group (size B, k drafts each):
    greedy row (no sampling rows, or its temperature 0):
        matched = leading drafts equal to the target's tokens; emitted e_j = target[b, j]
    sampled row: speculative sampling over the warped draft and target logits (kernels/sampling.py
        accept_sampled): matched = drafts accepted; e_j = d_{j+1} for j < matched, then the residual draw
    counts = min(matched + 1, k)
    active  = produced[b] < limit[b]; c = counts if active else 0
    out[b, produced[b] + j] = e_j for j < c; produced[b] += c
    draft and target lengths[b] += c; draft tokens_in[b] = e_{counts - 1} if active
    fresh[b] = [c, e_0 .. e_{c-1}, -1 ...]   (when asked for)
    accepted += (k, matched) if active            (integer atomics: the order does not matter)
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from conjugate.compiler.sampling import SamplingRows
from conjugate.kernels.sampling import accept_sampled


@triton.jit
def _settle(verify_in_ptr, verify_out_ptr, tokens_in_ptr, draft_len_ptr, target_len_ptr, out_ptr, produced_ptr,
            limit_ptr, accepted_ptr, out_stride,
            draft_logits_ptr, draft_stride_b, draft_stride_j, draft_vocab,  # sampling: q rows [B, k, Vd]
            target_logits_ptr, target_stride, target_vocab,  # p rows [B * (k + 1), Vt]
            temperature_ptr, top_p_ptr, top_k_ptr, seed_ptr,  # per-sequence sampling parameters
            fresh_ptr,
            K: tl.constexpr, KP: tl.constexpr, SAMPLING: tl.constexpr, FRESH: tl.constexpr, BLOCK: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    j = tl.arange(0, KP)
    row = b * (K + 1)
    target = tl.load(verify_out_ptr + row + j, mask=j < K, other=0)  # t_0..t_{k-1}
    drafts = tl.load(verify_in_ptr + row + 1 + j, mask=j < K, other=0)  # d_1..d_k
    mismatch = tl.where((drafts != target) & (j < K), j, K)
    matched = tl.min(mismatch, axis=0)  # drafts before the first mismatch
    emitted = target
    if SAMPLING:
        temperature = tl.load(temperature_ptr + b)
        if temperature > 0.0:
            matched, emitted = accept_sampled(
                drafts, target_logits_ptr + row * target_stride, target_stride, target_vocab,
                draft_logits_ptr + b * draft_stride_b, draft_stride_j, draft_vocab, temperature, tl.load(top_k_ptr + b),
                tl.load(top_p_ptr + b), tl.load(seed_ptr + b), tl.load(draft_len_ptr + b), K, KP, BLOCK)
    counts = tl.minimum(matched + 1, K)
    last = tl.sum(tl.where(j == counts - 1, emitted, 0), axis=0)
    produced = tl.load(produced_ptr + b)
    active = produced < tl.load(limit_ptr + b)
    c = tl.where(active, counts, 0)
    tl.store(out_ptr + b * out_stride + produced + j, emitted, mask=j < c)
    tl.store(produced_ptr + b, produced + c)
    tl.store(draft_len_ptr + b, tl.load(draft_len_ptr + b) + c)
    tl.store(target_len_ptr + b, tl.load(target_len_ptr + b) + c)
    tl.store(tokens_in_ptr + b, tl.where(active, last, tl.load(tokens_in_ptr + b)))
    if FRESH:
        tl.store(fresh_ptr + b * (K + 1), c)
        tl.store(fresh_ptr + b * (K + 1) + 1 + j, tl.where(j < c, emitted, -1), mask=j < K)
    tl.atomic_add(accepted_ptr, tl.where(active, K, 0).to(tl.int64))
    tl.atomic_add(accepted_ptr + 1, tl.where(active, matched, 0).to(tl.int64))


def settle(verify_in: torch.Tensor, verify_out: torch.Tensor, tokens_in: torch.Tensor, draft_lengths: torch.Tensor,
           target_lengths: torch.Tensor, out: torch.Tensor, produced: torch.Tensor, limit: torch.Tensor,
           accepted: torch.Tensor, *, sampling: SamplingRows | None = None, draft_logits: torch.Tensor | None = None,
           target_logits: torch.Tensor | None = None,
           fresh: torch.Tensor | None = None, block: int = 1024) -> None:
    """verify_in/verify_out [B, k + 1] int64 (the target's input [last, d_1..d_k] and its greedy
    tokens); tokens_in, draft/target lengths, produced, limit [B] int64 (views of the group's rows);
    out [B, width] int64 (rows contiguous); accepted [2] int64. Updated in place, no host sync.

    sampling: the group's rows (len B); its sampled rows need the logits the round wrote:
    draft_logits [B, k, Vd] and target_logits [B * (k + 1), Vt] fp32, rows contiguous. fresh: int64
    [B, k + 1], written: [tokens emitted this settle (0 for an inactive row), those tokens, -1 ...]."""
    b, k1 = verify_in.shape
    _check_state(verify_in, verify_out, tokens_in, draft_lengths, target_lengths, out, produced, limit, accepted)
    k, device = k1 - 1, verify_in.device
    logits = _sampling_logits(sampling, draft_logits, target_logits, b, k, device)
    if fresh is not None and (tuple(fresh.shape) != (b, k1) or fresh.dtype != torch.int64 or fresh.stride() != (k1, 1)):
        raise ValueError(f"fresh must be a contiguous int64 [{b}, {k1}], got {fresh.dtype} {tuple(fresh.shape)}")
    dummy = verify_in  # pointer arguments the kernel does not read
    rows = sampling if sampling is not None else SamplingRows(dummy, dummy, dummy, dummy)
    q, p = logits if logits else (dummy[:, :, None], dummy)
    vocab = max(q.shape[2], p.shape[1])
    _settle[(b,)](verify_in, verify_out, tokens_in, draft_lengths, target_lengths, out, produced, limit, accepted,
                  out.stride(0), q, q.stride(0), q.stride(1), q.shape[2], p, p.stride(0), p.shape[1],
                  rows.temperature, rows.top_p, rows.top_k, rows.seed,
                  fresh if fresh is not None else dummy, K=k, KP=triton.next_power_of_2(k),
                  SAMPLING=sampling is not None, FRESH=fresh is not None,
                  BLOCK=min(block, triton.next_power_of_2(vocab)), num_warps=4 if sampling is not None else 1)


def _check_state(verify_in, verify_out, tokens_in, draft_lengths, target_lengths, out, produced, limit, accepted):
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


def _sampling_logits(sampling, draft_logits, target_logits, b: int, k: int, device):
    """(draft_logits, target_logits) checked against the group, or None without sampling."""
    if sampling is None:
        if draft_logits is not None or target_logits is not None:
            raise ValueError("draft_logits and target_logits serve sampling: pass the sampling rows too")
        return None
    if draft_logits is None or target_logits is None:
        raise ValueError("sampling needs the round's draft_logits [B, k, Vd] and target_logits [B * (k + 1), Vt]")
    sampling.check(b, device)
    if draft_logits.dim() != 3 or tuple(draft_logits.shape[:2]) != (b, k) or draft_logits.stride(2) != 1:
        raise ValueError(f"draft_logits must be [{b}, {k}, Vd] with contiguous rows, got {tuple(draft_logits.shape)}")
    if target_logits.dim() != 2 or target_logits.shape[0] != b * (k + 1) or target_logits.stride(1) != 1:
        raise ValueError(f"target_logits must be [{b * (k + 1)}, Vt] with contiguous rows, got "
                         f"{tuple(target_logits.shape)}")
    for name, t in (("draft_logits", draft_logits), ("target_logits", target_logits)):
        if t.dtype != torch.float32 or t.device != device:
            raise ValueError(f"{name} must be fp32 on {device}, got {t.dtype} on {t.device}")
    return draft_logits, target_logits
