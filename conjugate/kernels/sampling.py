"""Sampling from fp32 logits rows warped by (temperature, top_k, top_p), on the device.

The warp, in this order: the scaled logits s_i = l_i / T; top-k keeps the k largest; top-p keeps, of
the renormalised top-k distribution, the smallest most likely set holding top_p of its mass. Both
cuts are a cutoff on s: token i is kept iff s_i >= cutoff, so tokens tied with the last one kept are
all kept (a cut never splits equal values; top-k may then keep more than k). Then

    prob_i = exp(s_i - max - lse)  where s_i >= cutoff, else 0      (lse: log-normaliser of the kept set)

Each cutoff is found by bisection over the fp32 values in their order as integers (`_order`): 32
steps of one pass over V give the exact value, not an approximation of it. A row with top_k = 0 (or
top_k >= V) and top_p = 1 skips both: its statistics cost two passes (max, then the normaliser).

Randomness is keyed by (seed, absolute position in the sequence, purpose) only: Philox (tl.randint)
turns (seed, position * PURPOSES + purpose) into the key of one draw, whose uniforms are then drawn
per vocabulary column, so a request's tokens do not depend on what else is batched beside it. A
uniform is (x + 0.5) / 2**32 of a Philox word x, exact near 0, and a draw is Gumbel-max:
argmax_i s_i - log(E_i) over the kept set, E_i = -log(1 - u_i) exponential (computed by its series
near 0, where the winners come from, instead of tl.rand's uniform, whose 1 - u loses precision there).
Positions up to 2**28 and vocabularies up to 2**31 stay within int32.
"""
import triton
import triton.language as tl

from conjugate.kernels.argmax import first_max, row_argmax

PURPOSES = tl.constexpr(3)  # what a draw at a position is for:
DRAFT = tl.constexpr(0)  # the draft's proposal
ACCEPT = tl.constexpr(1)  # the uniform of the acceptance test of a proposal
RESIDUAL = tl.constexpr(2)  # the target's token after a rejection
BISECTION_STEPS = tl.constexpr(32)  # halvings of the 2**32 fp32 orders: the exact cutoff


# -- warped statistics ---------------------------------------------------------------------
@triton.jit
def _order(x):
    """fp32 -> int32 in the same order (NaN aside)."""
    bits = x.to(tl.int32, bitcast=True)
    return tl.where(bits < 0, bits ^ 0x7FFFFFFF, bits)


@triton.jit
def _value(order):
    """The fp32 value of an order (the inverse of `_order`)."""
    bits = tl.where(order < 0, order ^ 0x7FFFFFFF, order).to(tl.int32)
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def scaled(row, offs, vocab, temperature):
    """The row's logits at `offs` over the temperature (-inf past the vocabulary); -0 made +0, so that
    equal values have one order."""
    s = tl.load(row + offs, mask=offs < vocab, other=float("-inf")).to(tl.float32) / temperature
    return tl.where(s == 0.0, 0.0, s)


@triton.jit
def _row_range(row, vocab, temperature, BLOCK: tl.constexpr):
    """(max, min) of the scaled row."""
    cols = tl.arange(0, BLOCK)
    high = tl.full([], float("-inf"), tl.float32)
    low = tl.full([], float("inf"), tl.float32)
    for start in range(0, vocab, BLOCK):
        offs = start + cols
        s = scaled(row, offs, vocab, temperature)
        high = tl.maximum(high, tl.max(s, axis=0))
        low = tl.minimum(low, tl.min(tl.where(offs < vocab, s, float("inf")), axis=0))
    return high, low


@triton.jit
def _kept(row, vocab, temperature, cutoff, shift, BY_MASS: tl.constexpr, BLOCK: tl.constexpr):
    """What the cutoff keeps: its tokens (a count) or, BY_MASS, their sum of exp(s - shift)."""
    cols = tl.arange(0, BLOCK)
    total = tl.full([], 0.0, tl.float32)
    for start in range(0, vocab, BLOCK):
        offs = start + cols
        s = scaled(row, offs, vocab, temperature)
        keep = (s >= cutoff) & (offs < vocab)
        weight = tl.exp(s - shift) if BY_MASS else tl.full([BLOCK], 1.0, tl.float32)
        total += tl.sum(tl.where(keep, weight, 0.0), axis=0)
    return total


@triton.jit
def _largest_cutoff(row, vocab, temperature, low, high, shift, target, BY_MASS: tl.constexpr,
                    BLOCK: tl.constexpr):
    """The largest cutoff in [low, high] (low keeps at least `target`) that still keeps `target`
    tokens or, BY_MASS, mass: bisection over the orders of the fp32 values."""
    lo = _order(low).to(tl.int64)
    hi = _order(high).to(tl.int64)
    for _ in range(0, BISECTION_STEPS):
        mid = lo + ((hi - lo + 1) >> 1)
        enough = _kept(row, vocab, temperature, _value(mid), shift, BY_MASS, BLOCK) >= target
        lo = tl.where(enough, mid, lo)
        hi = tl.where(enough, hi, mid - 1)
    return _value(lo)


@triton.jit
def warp_cutoff(row, vocab, temperature, top_k, top_p, BLOCK: tl.constexpr):
    """(max, cutoff) of the scaled row: top-k's cutoff, then top-p's over what top-k kept."""
    high, cutoff = _row_range(row, vocab, temperature, BLOCK)
    if (top_k > 0) & (top_k < vocab):
        cutoff = _largest_cutoff(row, vocab, temperature, cutoff, high, 0.0, top_k.to(tl.float32), False, BLOCK)
    if top_p < 1.0:
        mass = _kept(row, vocab, temperature, cutoff, high, True, BLOCK)
        cutoff = _largest_cutoff(row, vocab, temperature, cutoff, high, high, top_p * mass, True, BLOCK)
    return high, cutoff


@triton.jit
def warp_stats(row, vocab, temperature, top_k, top_p, BLOCK: tl.constexpr):
    """(max, lse, cutoff) of the warped row: prob_i = exp(s_i - max - lse) where s_i >= cutoff."""
    high, cutoff = warp_cutoff(row, vocab, temperature, top_k, top_p, BLOCK)
    lse = tl.log(_kept(row, vocab, temperature, cutoff, high, True, BLOCK))
    return high, lse, cutoff


@triton.jit
def warped_probs(row, offs, vocab, temperature, high, lse, cutoff):
    """The warped probabilities of the row's tokens at `offs` (0 where cut or past the vocabulary)."""
    s = scaled(row, offs, vocab, temperature)
    return tl.where((s >= cutoff) & (offs < vocab), tl.exp(s - high - lse), 0.0)


# -- draws ---------------------------------------------------------------------------------
@triton.jit
def draw_key(seed, position, purpose):
    """The Philox key of one draw: a function of (seed, position, purpose) alone."""
    counter = (position * PURPOSES + purpose).to(tl.int32)
    hi, lo, _, _ = tl.randint4x(seed, counter)
    return (hi.to(tl.uint64) << 32) | lo.to(tl.uint64)


@triton.jit
def uniform(key, offs):
    """Uniforms in (0, 1] per offset (1 only by rounding, about 2**-25 of the time)."""
    x = tl.randint(key, offs)
    return (x.to(tl.float32) + 0.5) * 2.3283064365386963e-10  # 2**-32


@triton.jit
def _exponential(u):
    """-log(1 - u): its series where u is small (relative error < 1e-8 there), where Gumbel-max
    winners come from."""
    series = u * (1.0 + u * (0.5 + u * (1.0 / 3.0 + u * (0.25 + u * (0.2 + u * (1.0 / 6.0))))))
    return tl.where(u < 0.0625, series, -tl.log(1.0 - u))


@triton.jit
def gumbel(key, offs):
    """Standard Gumbel noise per offset (-inf for u = 1)."""
    return -tl.log(_exponential(uniform(key, offs)))


@triton.jit
def draw_kept(row, vocab, temperature, cutoff, key, BLOCK: tl.constexpr):
    """A token of the warped row (Gumbel-max over the kept set)."""
    cols = tl.arange(0, BLOCK)
    best_val = tl.full([], float("-inf"), tl.float32)
    best_idx = tl.full([], 0, tl.int64)
    for start in range(0, vocab, BLOCK):
        offs = start + cols
        s = scaled(row, offs, vocab, temperature)
        score = tl.where((s >= cutoff) & (offs < vocab), s + gumbel(key, offs), float("-inf"))
        best_val, best_idx = first_max(best_val, best_idx, score, start)
    return best_idx


@triton.jit
def sample_row(row, vocab, temperature, top_k, top_p, key, BLOCK: tl.constexpr):
    """A token of the row warped by (temperature > 0, top_k, top_p), drawn with `key`."""
    _, cutoff = warp_cutoff(row, vocab, temperature, top_k, top_p, BLOCK)
    return draw_kept(row, vocab, temperature, cutoff, key, BLOCK)


@triton.jit
def sample_tile(pid,
                logits_ptr, vocab, stride_logits,  # the rows' logits, fp32 [rows, >= vocab]
                out_ptr, stride_out,  # their tokens: out[row * stride_out]
                lengths_ptr, step,  # row's position: lengths[row] + step + 1
                temperature_ptr, top_p_ptr, top_k_ptr, seed_ptr,  # per-row sampling parameters
                BLOCK: tl.constexpr):
    """A draft step's next token per row: argmax_tile's token at temperature 0, else a draw from the
    warped row keyed by (seed, position, DRAFT)."""
    row = pid.to(tl.int64)
    logits = logits_ptr + row * stride_logits
    temperature = tl.load(temperature_ptr + row)
    if temperature == 0.0:
        token = row_argmax(logits, vocab, BLOCK)
    else:
        position = tl.load(lengths_ptr + row) + step + 1
        key = draw_key(tl.load(seed_ptr + row), position, DRAFT)
        token = sample_row(logits, vocab, temperature, tl.load(top_k_ptr + row), tl.load(top_p_ptr + row), key,
                           BLOCK)
    tl.store(out_ptr + row * stride_out, token.to(out_ptr.dtype.element_ty))


# -- speculative sampling: the accept step of a sampled sequence ---------------------------
@triton.jit
def prob_of(row, token, vocab, temperature, high, lse, cutoff):
    """The warped probability of one token of the row."""
    return tl.sum(warped_probs(row, token + tl.arange(0, 1), vocab, temperature, high, lse, cutoff), axis=0)


@triton.jit
def draw_residual(target, draft, target_vocab, draft_vocab, temperature, p_stats, q_stats, key,
                  BLOCK: tl.constexpr):
    """A token of normalize(max(0, p - q)) (Gumbel-max over log(p - q) where positive); p where the
    residual is empty (p <= q everywhere: a rejection only rounding can cause)."""
    cols = tl.arange(0, BLOCK)
    best_val = tl.full([], float("-inf"), tl.float32)
    best_idx = tl.full([], 0, tl.int64)
    for start in range(0, target_vocab, BLOCK):
        offs = start + cols
        p = warped_probs(target, offs, target_vocab, temperature, p_stats[0], p_stats[1], p_stats[2])
        q = warped_probs(draft, offs, draft_vocab, temperature, q_stats[0], q_stats[1], q_stats[2])
        score = tl.where(p > q, tl.log(tl.where(p > q, p - q, 1.0)) + gumbel(key, offs), float("-inf"))
        best_val, best_idx = first_max(best_val, best_idx, score, start)
    if best_val == float("-inf"):
        best_idx = draw_kept(target, target_vocab, temperature, p_stats[2], key, BLOCK)
    return best_idx


@triton.jit
def accept_sampled(drafts, target, stride_target, target_vocab, draft, stride_draft, draft_vocab,
                   temperature, top_k, top_p, seed, length, K: tl.constexpr, KP: tl.constexpr,
                   BLOCK: tl.constexpr):
    """Speculative sampling of one sequence (Leviathan et al. 2023; Chen et al. 2023). drafts [KP]:
    d_1..d_k, d_{j+1} drawn from draft row j (q_j, the warped draft distribution); target row j gives
    p_j. d_{j+1} is accepted while u_j < p_j(d) / q_j(d), u_j keyed by (seed, its position, ACCEPT);
    at the first rejection j the token is drawn from normalize(max(0, p_j - q_j)), keyed by (seed,
    its position, RESIDUAL). Position of d_{j+1}: length + j + 1.
    -> (accepted drafts n, emitted [KP]: d_1..d_n, then the residual draw when n < K)."""
    j = tl.arange(0, KP)
    accepted = tl.full([], 0, tl.int32)
    p_high, p_lse, p_cut = tl.full([], 0.0, tl.float32), tl.full([], 0.0, tl.float32), tl.full([], 0.0, tl.float32)
    q_high, q_lse, q_cut = tl.full([], 0.0, tl.float32), tl.full([], 0.0, tl.float32), tl.full([], 0.0, tl.float32)
    for i in range(0, K):
        if accepted == i:  # every draft before d_{i+1} accepted: test it
            token = tl.sum(tl.where(j == i, drafts, 0), axis=0)
            p_row, q_row = target + i * stride_target, draft + i * stride_draft
            p_high, p_lse, p_cut = warp_stats(p_row, target_vocab, temperature, top_k, top_p, BLOCK)
            q_high, q_lse, q_cut = warp_stats(q_row, draft_vocab, temperature, top_k, top_p, BLOCK)
            p = prob_of(p_row, token, target_vocab, temperature, p_high, p_lse, p_cut)
            q = prob_of(q_row, token, draft_vocab, temperature, q_high, q_lse, q_cut)
            u = uniform(draw_key(seed, length + i + 1, ACCEPT), tl.full([], 0, tl.int32))
            accepted += (u * q < p).to(tl.int32)
    emitted = tl.where(j < accepted, drafts, 0)
    if accepted < K:
        key = draw_key(seed, length + accepted + 1, RESIDUAL)
        residual = draw_residual(target + accepted * stride_target, draft + accepted * stride_draft, target_vocab,
                                 draft_vocab, temperature, (p_high, p_lse, p_cut), (q_high, q_lse, q_cut), key, BLOCK)
        emitted = tl.where(j == accepted, residual, emitted)
    return accepted, emitted
