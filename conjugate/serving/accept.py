"""Greedy acceptance of a verified draft: the rules, as torch operations on the device. The decoder
runs them as one launch (settle.py), which is checked against these.

The draft proposed d_1..d_k after the last accepted token; the target, fed [last, d_1..d_k], predicts
t_0..t_k (t_j: the token after position L + j). Draft token d_{j+1} is accepted while it equals t_j.
With n accepted, the round emits t_0..t_{m-1}, m = min(n + 1, k): the accepted drafts (equal to the
target's own tokens) and the target's next token. When every draft is accepted the last target token
t_k is left to the next round (it comes back as that round's t_0): the draft then has the keys and
values of every emitted token, so both caches stay valid up to the new length L + m, and rejected
entries are dropped by the length alone.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Accepted:
    tokens: torch.Tensor  # [B, k] t_0..t_{k-1}; only the first `counts[b]` of row b are emitted
    counts: torch.Tensor  # [B] int64, tokens emitted per sequence (1..k)
    drafts_accepted: torch.Tensor  # [B] int64, draft tokens that matched (0..k)
    last: torch.Tensor  # [B] int64, the last emitted token: the next round's input


def accept(draft_tokens: torch.Tensor, target_tokens: torch.Tensor) -> Accepted:
    """draft_tokens [B, k], target_tokens [B, k + 1] -> what the round emits."""
    k = draft_tokens.shape[1]
    matched = (draft_tokens == target_tokens[:, :k]).long().cumprod(1).sum(1)  # [B]
    counts = (matched + 1).clamp(max=k)  # [B]
    last = target_tokens.gather(1, (counts - 1)[:, None])[:, 0]  # [B]
    return Accepted(target_tokens[:, :k], counts, matched, last)


def append_emitted(out: torch.Tensor, produced: torch.Tensor, accepted: Accepted) -> None:
    """Write each sequence's emitted tokens after what it produced so far and advance `produced`.

    out: [B, width] int64, its last column scratch (what is not emitted lands there), so every
    emitted position must lie before it; produced: [B] int64.
    """
    k = accepted.tokens.shape[1]
    j = torch.arange(k, device=out.device)  # [k]
    keep = j[None, :] < accepted.counts[:, None]  # [B, k]
    cols = torch.where(keep, produced[:, None] + j[None, :], out.shape[1] - 1)  # [B, k]
    out.scatter_(1, cols, accepted.tokens)
    produced.add_(accepted.counts)
