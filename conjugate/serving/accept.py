"""Acceptance of a verified draft: the rules, as torch operations on the device. The decoder runs
them as one launch (settle.py), which is checked against these.

The draft proposed d_1..d_k after the last accepted token; the target, fed [last, d_1..d_k], predicts
t_0..t_k (t_j: the token after position L + j).

Greedy (`accept`): draft token d_{j+1} is accepted while it equals t_j. With n accepted, the round
emits t_0..t_{m-1}, m = min(n + 1, k): the accepted drafts (equal to the target's own tokens) and
the target's next token. When every draft is accepted the last target token t_k is left to the next
round (it comes back as that round's t_0): the draft then has the keys and values of every emitted
token, so both caches stay valid up to the new length L + m, and rejected entries are dropped by the
length alone.

Sampled (`accept_sampled`, speculative sampling: Leviathan et al. 2023, Chen et al. 2023): with p_j
and q_j the warped target and draft distributions after d_1..d_j (`warp_probs`), d_{j+1} (drawn from
q_j) is accepted while u_j < p_j(d_{j+1}) / q_j(d_{j+1}); at the first rejection j the round emits a
draw from normalize(max(0, p_j - q_j)) instead. Each emitted token is then distributed exactly as
p_j given the tokens before it. The counts are the greedy rule's, min(n + 1, k): when all k drafts
are accepted, the bonus draw from p_k is not made. That stays lossless: a position's token is decided
by one round only, by this rule, whose output follows p whatever the draft proposed; leaving position
L + k + 1 to the next round only means it is decided there, from the same prefix, by the same rule.
The uniforms and Gumbel noises are keyed by (seed, position, purpose) (kernels/sampling.py), and the
keys of a position a round leaves undecided were never consulted by what it emitted, so reusing them
when the next round decides that position keeps them independent of everything emitted before.

"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Accepted:
    tokens: torch.Tensor  # [B, k] greedy: t_0..t_{k-1}; only the first `counts[b]` of row b are emitted
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


def warp_probs(logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor,
               top_p: torch.Tensor) -> torch.Tensor:
    """logits [B, ..., V] and each sequence's parameters [B] (temperature > 0) -> the warped
    distributions [B, ..., V]: temperature, then the top_k largest (0: all), then of their
    renormalised distribution the smallest most likely set holding top_p. Tokens tied with the last
    one a cut keeps are kept."""
    shape = (-1,) + (1,) * (logits.dim() - 1)
    scaled = logits.float() / temperature.view(shape)
    vocab = scaled.shape[-1]
    ordered = scaled.sort(-1, descending=True).values
    k = torch.where((top_k > 0) & (top_k < vocab), top_k, vocab).view(shape).expand(*scaled.shape[:-1], 1)
    scaled = scaled.masked_fill(scaled < ordered.gather(-1, k - 1), float("-inf"))
    probs = scaled.softmax(-1)
    ordered_p, order = probs.sort(-1, descending=True)
    before = ordered_p.cumsum(-1) - ordered_p  # mass of the tokens ranked above
    kept = before < top_p.view(shape)
    cutoff = torch.where(kept, scaled.gather(-1, order), float("inf")).amin(-1, keepdim=True)
    return scaled.masked_fill(scaled < cutoff, float("-inf")).softmax(-1)


def gumbel_draw(probs: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
    """argmax(log probs + noise) over the support: a draw from probs [..., V] given standard Gumbel
    noise [..., V] (first index on ties)."""
    return torch.where(probs > 0, probs.log() + noise, float("-inf")).argmax(-1)


def accept_sampled(draft_tokens: torch.Tensor, p: torch.Tensor, q: torch.Tensor, uniforms: torch.Tensor,
                   residual_noise: torch.Tensor) -> Accepted:
    """draft_tokens [B, k] (d_{j+1} drawn from q[:, j]); p [B, >= k, Vt] and q [B, k, Vd] the warped
    target and draft distributions; uniforms [B, k] the acceptance tests' u_j; residual_noise
    [B, k, Vt] the Gumbel noise of a residual draw at each j -> what the round emits (`tokens`: d_1..d_n,
    then the residual draw; `drafts_accepted`: n)."""
    k, vocab = draft_tokens.shape[1], p.shape[-1]
    p = p[:, :k]
    q = torch.nn.functional.pad(q, (0, max(vocab - q.shape[-1], 0)))[..., :vocab]
    pd = p.gather(-1, draft_tokens[..., None])[..., 0]  # [B, k]
    qd = q.gather(-1, draft_tokens[..., None])[..., 0]
    accepted = (uniforms * qd < pd).long().cumprod(1).sum(1)  # [B]
    residual = (p - q).clamp(min=0)
    empty = ~(residual > 0).any(-1, keepdim=True)  # p <= q everywhere: only rounding rejects there
    draws = gumbel_draw(torch.where(empty, p, residual), residual_noise)  # [B, k]
    j = torch.arange(k, device=draft_tokens.device)
    tokens = torch.where(j[None, :] < accepted[:, None], draft_tokens, draws)
    counts = (accepted + 1).clamp(max=k)
    return Accepted(tokens, counts, accepted, tokens.gather(1, (counts - 1)[:, None])[:, 0])
