"""Sampling on the device (kernels/sampling.py: the sample part, the sampled accept step of settle.py)
against the torch rules of serving/accept.py, under the interpreter.

Two kinds of check: exact ones, the kernel's tokens equal to the rules' given the same random numbers
(this file replays the kernels' Philox draws on the host), and statistical ones, frequencies against
the distributions they must follow by a chi-square test at ALPHA = 1e-3 (scipy's survival function
where scipy is installed, else the closed forms in `_chi2_sf`). The interpreter runs one program at a
time, some 30 ms a draw here: the statistical checks keep the vocabulary tiny and draw a few hundred
times, enough to catch a wrong distribution (the draft's instead of the target's, say)."""
from __future__ import annotations

import math

import conjugate  # noqa: F401, I001  (selects the interpreter before triton is imported)
import numpy as np
import pytest
import torch
import triton
import triton.language as tl

from conjugate.compiler.embed import sample_call
from conjugate.compiler.sampling import SamplingRows, launch_sample
from conjugate.kernels.sampling import warp_stats, warped_probs
from conjugate.serving.accept import Accepted, accept, accept_sampled, gumbel_draw, warp_probs
from conjugate.serving.requests import SamplingParams
from conjugate.serving.settle import settle
from test_settle import WIDTH, assert_same, random_state, reference_settle, run_settle  # tests/test_settle.py

ALPHA = 1e-3
DRAFT, ACCEPT, RESIDUAL, PURPOSES = 0, 1, 2, 3  # kernels/sampling.py's purposes


# -- the kernels' random numbers, replayed on the host ------------------------------------------
M32 = 0xFFFFFFFF


def _philox(key: int, counter: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The first two words of Philox 4x32-10 (as Triton's tl.randint4x) of counters (counter, 0, 0, 0)."""
    c0, c1, c2, c3 = counter.astype(np.uint64), *(np.zeros_like(counter, dtype=np.uint64) for _ in range(3))
    k0, k1 = np.uint64(key & M32), np.uint64(key >> 32)
    a, b, m = np.uint64(0xD2511F53), np.uint64(0xCD9E8D57), np.uint64(M32)
    for _ in range(10):
        p0, p2 = a * c0, b * c2  # 32 x 32 bits: exact in uint64
        c0, c1, c2, c3 = ((p2 >> np.uint64(32)) ^ c1 ^ k0, p2 & m, (p0 >> np.uint64(32)) ^ c3 ^ k1, p0 & m)
        k0, k1 = (k0 + np.uint64(0x9E3779B9)) & m, (k1 + np.uint64(0xBB67AE85)) & m
    return c0, c1


def _draw_key(seed: int, position: int, purpose: int) -> int:
    hi, lo = _philox(seed, np.array([position * PURPOSES + purpose]))
    return (int(hi[0]) << 32) | int(lo[0])


def _uniforms(seed: int, position: int, purpose: int, n: int) -> np.ndarray:
    x, _ = _philox(_draw_key(seed, position, purpose), np.arange(n))
    return (x.astype(np.float32) + np.float32(0.5)) * np.float32(2.0 ** -32)


def _gumbel(seed: int, position: int, purpose: int, n: int) -> torch.Tensor:
    u = _uniforms(seed, position, purpose, n)
    with np.errstate(divide="ignore"):
        e = np.where(u < 0.0625, u * (1 + u * (0.5 + u * (1 / 3 + u * (0.25 + u * (0.2 + u / 6))))), -np.log1p(-u))
        return torch.from_numpy(-np.log(e.astype(np.float32)))


# -- statistics -------------------------------------------------------------------------------
def _chi2_sf(x: float, dof: int) -> float:
    """P(chi2(dof) > x): scipy's where installed, else the closed forms for integer dof."""
    try:
        from scipy.stats import chi2
    except ImportError:
        half = x / 2
        if dof % 2 == 0:
            return math.exp(-half) * sum(half ** i / math.factorial(i) for i in range(dof // 2))
        term, total = math.sqrt(x) * math.exp(-half) * math.sqrt(2 / math.pi), 0.0
        for i in range(1, (dof + 1) // 2):
            total, term = total + term, term * x / (2 * i + 1)
        return math.erfc(math.sqrt(half)) + total
    return float(chi2.sf(x, dof))


def _fits(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """The chi-square test's p-value of counts [V] drawn from probs [V] (cells of probability 0 must be empty)."""
    assert counts[probs == 0].sum() == 0, (counts, probs)
    expected = probs[probs > 0].double() * counts.sum()
    observed = counts[probs > 0].double()
    return _chi2_sf(float(((observed - expected) ** 2 / expected).sum()), int((probs > 0).sum()) - 1)


def test_the_own_chi_square_survival_matches_known_values():
    import builtins

    real_import = builtins.__import__

    def without_scipy(name, *args, **kwargs):
        if name.startswith("scipy"):
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    builtins.__import__ = without_scipy
    try:
        values = [_chi2_sf(x, dof) for x, dof in ((3.841459, 1), (5.991465, 2), (16.26624, 3), (11.34487, 3),
                                                  (20.51501, 5))]
    finally:
        builtins.__import__ = real_import
    assert values == pytest.approx([0.05, 0.05, 0.001, 0.01, 0.001], rel=1e-4)


# -- warped distributions ---------------------------------------------------------------------
@triton.jit
def _probs_kernel(logits_ptr, probs_ptr, vocab, temperature_ptr, top_p_ptr, top_k_ptr, VP: tl.constexpr,
                  BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    logits = logits_ptr + row * vocab
    temperature = tl.load(temperature_ptr + row)
    high, lse, cutoff = warp_stats(logits, vocab, temperature, tl.load(top_k_ptr + row), tl.load(top_p_ptr + row),
                                   BLOCK)
    offs = tl.arange(0, VP)
    tl.store(probs_ptr + row * vocab + offs, warped_probs(logits, offs, vocab, temperature, high, lse, cutoff),
             mask=offs < vocab)


def _warped_on_device(logits: torch.Tensor, rows: SamplingRows, block: int) -> torch.Tensor:
    probs = torch.full_like(logits, float("nan"))
    vocab = logits.shape[1]
    _probs_kernel[(logits.shape[0],)](logits, probs, vocab, rows.temperature, rows.top_p, rows.top_k,
                                      VP=triton.next_power_of_2(vocab), BLOCK=block)
    return probs


def _rows(params: list[SamplingParams]) -> SamplingRows:
    rows = SamplingRows.allocate(len(params), "cpu")
    for r, p in enumerate(params):
        rows.set(r, p)
    return rows


# (temperature, top_k, top_p): each cut alone, both, cuts that keep one token or everything
WARPS = [(1.0, 0, 1.0), (0.5, 0, 1.0), (2.0, 0, 1.0), (1.0, 3, 1.0), (0.7, 1, 1.0), (1.0, 12, 1.0), (1.0, 40, 1.0),
         (1.0, 0, 0.9), (1.3, 0, 0.5), (0.8, 0, 0.05), (1.0, 5, 0.8), (2.5, 7, 0.6), (1.0, 4, 0.999)]


def test_warped_distribution_matches_the_reference():
    """Temperature, then top-k, then top-p over the renormalised top-k distribution; the rows span
    two BLOCK chunks, so every pass loops."""
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(len(WARPS), 12, generator=g) * 2
    rows = _rows([SamplingParams(temperature=t, top_k=k, top_p=p) for t, k, p in WARPS])
    got = _warped_on_device(logits, rows, block=8)
    want = warp_probs(logits, rows.temperature, rows.top_k, rows.top_p)
    assert torch.equal(got > 0, want > 0), (got > 0) ^ (want > 0)  # the same tokens kept
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-7)
    kept = (want > 0).sum(1).tolist()
    assert kept[4] == 1 and kept[3] == 3 and kept[6] == 12 and kept[0] == 12  # top_k 1, 3, past V, off


def test_tokens_tied_at_a_cutoff_are_kept():
    logits = torch.tensor([[3.0, 1.0, 2.0, 2.0, 0.5, 2.0, -1.0, 0.0],  # top-2 cuts inside a three-way tie
                           [1.0, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0]])  # top-p 0.3 of four equal tokens
    rows = _rows([SamplingParams(temperature=1.0, top_k=2), SamplingParams(temperature=1.0, top_p=0.3)])
    kept = _warped_on_device(logits, rows, block=8) > 0
    assert kept[0].tolist() == [True, False, True, True, False, True, False, False]
    assert kept[1].tolist() == [True] * 4 + [False] * 4
    assert torch.equal(kept, warp_probs(logits, rows.temperature, rows.top_k, rows.top_p) > 0)


# -- the draft's sample part ------------------------------------------------------------------
def _sample(logits: torch.Tensor, rows: SamplingRows, lengths: torch.Tensor, step: int = 0,
            block: int = 8) -> torch.Tensor:
    out = torch.full((logits.shape[0],), -1, dtype=torch.int64)
    launch_sample(sample_call(logits, out, lengths, rows, rows=logits.shape[0], vocab=logits.shape[1], step=step,
                              block=block))
    return out


def test_temperature_zero_rows_take_the_argmax_first_index_on_ties():
    g = torch.Generator().manual_seed(1)
    logits = torch.randint(0, 3, (6, 12), generator=g).float()  # many ties, some across chunks
    logits[0] = float("-inf")
    rows = _rows([SamplingParams(top_k=2, top_p=0.5, seed=9)] * 6)  # cuts and seeds do not matter at 0
    assert torch.equal(_sample(logits, rows, torch.arange(6)), logits.argmax(1))


def test_sampled_tokens_are_the_reference_draws():
    """Each row's token is the Gumbel-max draw over its warped distribution with the noise keyed by
    (seed, length + step + 1, DRAFT)."""
    g = torch.Generator().manual_seed(2)
    logits = torch.randn(len(WARPS), 12, generator=g) * 2
    seeds = [5, 2 ** 62 + 3, 0, 77] * 4
    rows = _rows([SamplingParams(temperature=t, top_k=k, top_p=p, seed=s) for (t, k, p), s in zip(WARPS, seeds)])
    lengths, step = torch.tensor([0, 3, 1 << 20, 9] * 4)[:len(WARPS)], 2
    probs = warp_probs(logits, rows.temperature, rows.top_k, rows.top_p)
    noise = torch.stack([_gumbel(s, int(n) + step + 1, DRAFT, 12) for s, n in zip(seeds, lengths)])
    assert torch.equal(_sample(logits, rows, lengths, step), gumbel_draw(probs, noise))


def test_draws_follow_the_warped_distribution():
    """Chi-square of 200 draws (200 seeds) against softmax(logits / T)."""
    n, logits = 200, torch.tensor([1.0, 0.2, -0.5, 0.7, -2.0, 0.0])
    rows = _rows([SamplingParams(temperature=0.8, seed=1000 + i) for i in range(n)])
    tokens = _sample(logits.repeat(n, 1), rows, torch.full((n,), 4))
    probs = torch.softmax(logits / 0.8, 0)
    assert _fits(torch.bincount(tokens, minlength=6), probs) > ALPHA


def test_a_draw_depends_on_its_seed_and_position_only():
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(4, 16, generator=g) * 0.1  # near uniform: other keys draw other tokens
    params = [SamplingParams(temperature=1.0, seed=s) for s in (1, 2, 1, 1)]
    lengths = torch.tensor([5, 5, 5, 6])
    batched = _sample(logits[[0, 1, 0, 0]], _rows(params), lengths)
    alone = _sample(logits[[0]], _rows(params[:1]), lengths[:1])
    assert batched[0] == batched[2] == alone[0]  # the same key and row: the same token, whatever is beside it
    seeds = _sample(logits[[0] * 16], _rows([SamplingParams(temperature=1.0, seed=s) for s in range(16)]),
                    torch.full((16,), 5))
    positions = _sample(logits[[0] * 16], _rows(params[:1] * 16), torch.arange(16))
    assert len(set(seeds.tolist())) > 1 and len(set(positions.tolist())) > 1


def test_sample_call_refuses_rows_it_cannot_read():
    logits, out = torch.zeros(2, 8), torch.zeros(2, dtype=torch.int64)
    with pytest.raises(ValueError, match="sampling temperature"):
        sample_call(logits, out, torch.zeros(2, dtype=torch.int64), SamplingRows.allocate(3, "cpu"), rows=2, vocab=8)
    with pytest.raises(ValueError, match="lengths must be"):
        sample_call(logits, out, torch.zeros(2, dtype=torch.int32), SamplingRows.allocate(2, "cpu"), rows=2, vocab=8)


@pytest.mark.parametrize("row,params,match", [(2, SamplingParams(), "row 2"), (-1, SamplingParams(), "row -1"),
                                              (0, {"temperature": 1.0}, "expected SamplingParams")])
def test_sampling_rows_refuse_bad_arguments(row, params, match):
    with pytest.raises(ValueError, match=match):
        SamplingRows.allocate(2, "cpu").set(row, params)


def test_a_row_set_and_reset():
    rows = SamplingRows.allocate(2, "cpu")
    rows[1:].set(0, SamplingParams(temperature=0.5, top_p=0.9, top_k=4, seed=11))
    rows.set(0, SamplingParams(temperature=1.0))  # no seed: one drawn
    assert (rows.temperature.tolist(), rows.top_k.tolist(), rows.seed[1].item()) == ([1.0, 0.5], [0, 4], 11)
    rows.set_greedy(1)
    assert (rows.temperature[1].item(), rows.top_p[1].item(), rows.top_k[1].item()) == (0.0, 1.0, 0)


# -- the accept step of sampled rows ------------------------------------------------------------
def _sampled_reference(verify_in, verify_out, draft_logits, target_logits, rows: SamplingRows,
                       lengths: torch.Tensor) -> Accepted:
    """accept.py's rules per row: greedy at temperature 0, else accept_sampled with the kernel's
    uniforms and residual noise (keyed by seed and position L + j + 1)."""
    batch, k = verify_in.shape[0], verify_in.shape[1] - 1
    vocab = target_logits.shape[1]
    p = warp_probs(target_logits.view(batch, k + 1, vocab), rows.temperature.clamp(min=1e-3), rows.top_k, rows.top_p)
    q = warp_probs(draft_logits, rows.temperature.clamp(min=1e-3), rows.top_k, rows.top_p)
    keys = [(int(s), int(n) + j + 1) for s, n in zip(rows.seed, lengths) for j in range(k)]
    uniforms = torch.tensor(np.array([_uniforms(s, pos, ACCEPT, 1)[0] for s, pos in keys])).view(batch, k)
    noise = torch.stack([_gumbel(s, pos, RESIDUAL, vocab) for s, pos in keys]).view(batch, k, vocab)
    sampled, greedy = accept_sampled(verify_in[:, 1:], p, q, uniforms, noise), accept(verify_in[:, 1:], verify_out)
    pick = rows.temperature > 0
    return Accepted(*(torch.where(pick.view(-1, *(1,) * (a.dim() - 1)), a, b) for a, b in zip(
        (sampled.tokens, sampled.counts, sampled.drafts_accepted, sampled.last),
        (greedy.tokens, greedy.counts, greedy.drafts_accepted, greedy.last))))


def test_sampled_rows_settle_by_the_rules_of_accept_sampled():
    """Greedy and sampled rows (cuts among them) in one launch: the state settle leaves
    is the rules' given the kernel's random numbers, drafts accepted in every number 0..k."""
    g = torch.Generator().manual_seed(7)
    k, batch, vocab = 3, 12, 8
    params = [SamplingParams(temperature=t, top_k=tk, top_p=tp, seed=s) for s, (t, tk, tp) in
              enumerate([(1.0, 0, 1.0), (0.0, 0, 1.0), (0.7, 0, 1.0), (1.0, 3, 1.0), (1.5, 0, 0.8), (1.0, 4, 0.9)] * 2)]
    rows = _rows(params)
    draft_logits = torch.randn(batch, k, vocab, generator=g)
    target_logits = (draft_logits + 0.5 * torch.randn(batch, k, vocab, generator=g))  # agreeing, mostly
    target_logits = torch.cat([target_logits, torch.randn(batch, 1, vocab, generator=g)], 1).view(-1, vocab)
    q = warp_probs(draft_logits, rows.temperature.clamp(min=1e-3), rows.top_k, rows.top_p)
    drafts = torch.multinomial(q.view(-1, vocab), 1, generator=g).view(batch, k)  # drawn from q, as the draft does
    verify_in = torch.cat([torch.zeros(batch, 1, dtype=torch.int64), drafts], 1)
    verify_out = torch.cat([drafts[:, :1], torch.randint(0, vocab, (batch, k), generator=g)], 1)
    state = random_state(g, batch)
    state[5][:] = 50  # every row active but the padding row
    state[5][0] = 0
    result = _sampled_reference(verify_in, verify_out, draft_logits, target_logits, rows, state[1])
    got = run_settle(verify_in, verify_out, state, sampling=rows, draft_logits=draft_logits,
                     target_logits=target_logits)
    assert_same(got, reference_settle(verify_in, verify_out, *state, result=result))
    assert set(result.drafts_accepted[rows.temperature > 0].tolist()) == set(range(k + 1))


def test_acceptance_follows_min_one_p_over_q_and_emits_p():
    """k = 1, 240 sequences, synthetic p and q, drafts drawn from q: a draft d is accepted at the rate
    min(1, p(d) / q(d)) (chi-square over the d that may be rejected; always where p(d) >= q(d)), and
    the token emitted is distributed as p."""
    n, p, q = 240, torch.tensor([0.1, 0.2, 0.3, 0.4]), torch.tensor([0.4, 0.3, 0.2, 0.1])
    g = torch.Generator().manual_seed(6)
    drafts = torch.multinomial(q, n, replacement=True, generator=g)
    verify_in = torch.stack([torch.zeros(n, dtype=torch.int64), drafts], 1)
    state = (torch.zeros(n, dtype=torch.int64), torch.full((n,), 3), torch.full((n,), 3),
             torch.zeros(n, WIDTH, dtype=torch.int64), torch.zeros(n, dtype=torch.int64), torch.full((n,), 9),
             torch.zeros(2, dtype=torch.int64))
    got = run_settle(verify_in, torch.zeros_like(verify_in), state,
                     sampling=_rows([SamplingParams(temperature=1.0, seed=i) for i in range(n)]),
                     draft_logits=q.log().repeat(n, 1, 1), target_logits=p.log().repeat(2 * n, 1))
    emitted = got["fresh"][:, 1]
    kept = emitted == drafts
    rate = (p / q).clamp(max=1)
    assert kept[rate[drafts] == 1].all()
    tested = [d for d in range(4) if rate[d] < 1]
    statistic = sum(float((kept[drafts == d].sum() - (drafts == d).sum() * rate[d]) ** 2
                          / ((drafts == d).sum() * rate[d] * (1 - rate[d]))) for d in tested)
    assert _chi2_sf(statistic, len(tested)) > ALPHA
    assert _fits(torch.bincount(emitted, minlength=4), p) > ALPHA
    assert got["accepted"].tolist() == [n, int(kept.sum())]


def test_settle_refuses_sampling_without_its_logits():
    rows = torch.zeros(2, 3, dtype=torch.int64)
    vec = torch.zeros(2, dtype=torch.int64)
    state = (vec, vec, vec, torch.zeros(2, 8, dtype=torch.int64), vec, vec, torch.zeros(2, dtype=torch.int64))
    with pytest.raises(ValueError, match="sampling needs the round's draft_logits"):
        settle(rows, rows, *state, sampling=SamplingRows.allocate(2, "cpu"))
    with pytest.raises(ValueError, match="draft_logits must be"):
        settle(rows, rows, *state, sampling=SamplingRows.allocate(2, "cpu"), draft_logits=torch.zeros(2, 3, 4),
               target_logits=torch.zeros(6, 4))


# -- rounds that sample ---------------------------------------------------------------------------
def _draws_of(outputs, rows: SamplingRows, lengths: torch.Tensor, row: int) -> torch.Tensor:
    """The tokens the draft's row must have drawn from the logits it wrote, step by step."""
    logits = outputs.draft_logits[row]  # [k, V]
    k, vocab = logits.shape
    pick = slice(row, row + 1)
    probs = warp_probs(logits[None], rows.temperature[pick], rows.top_k[pick], rows.top_p[pick])[0]
    noise = torch.stack([_gumbel(int(rows.seed[row]), int(lengths[row]) + s + 1, DRAFT, vocab) for s in range(k)])
    return gumbel_draw(probs, noise)


def _check_sampling_round(want, sampled, inputs) -> None:
    """Row 0 greedy, row 1 sampled: row 0 drafts the greedy round's tokens (`want`'s), row 1 the
    draws from the logits it wrote; the target's tokens are the greedy round's."""
    rows = sampled.bufs.draft.sampling
    rows.set(1, SamplingParams(temperature=1.5, top_k=20, seed=123))
    sampled.load(inputs)
    sampled.bufs.poison()
    sampled.run()
    got = sampled.outputs()
    assert torch.equal(got.draft_tokens[0], want.draft_tokens[0])
    assert torch.equal(got.target_tokens, want.target_tokens)
    assert got.draft_logits is not None and got.target_logits is not None
    assert torch.equal(got.draft_tokens[1], _draws_of(got, rows, inputs.draft_lengths, 1))
    assert not torch.equal(got.draft_tokens[1], want.draft_tokens[1])  # 20 of the tiny vocabulary at T = 1.5


def test_a_compiled_round_that_samples(tmp_path):
    """A shipped plan (lm_head+argmax fused) compiled to sample: the fusion goes, the draft's argmax
    becomes the sample part, and the kernels live apart from the greedy round's. The greedy round of
    this plan computes the reference round's tokens exactly (test_round.py): the reference stands in."""
    from conjugate.compiler.round import compile_round, round_key
    from conjugate.plan import validate_plan
    from conjugate.plan.transforms import keeping_logits
    from test_round import _round, _shipped

    rnd = _round("llama")
    plan = validate_plan(_shipped("sequential"))
    sampled = compile_round(plan, rnd.workload, rnd.draft, rnd.target, cache_dir=tmp_path, sampling=True)
    assert sampled.bufs.target.sampling is None
    tiles = [p.sig.fn for launch in sampled.launches for p in launch.parts]
    assert tiles.count("sample_tile") == rnd.workload.k and "argmax_tile" in tiles  # the target's argmax stays
    unfused = keeping_logits(plan)
    assert unfused.hash != plan.hash
    assert sampled.source_dir.name == round_key(unfused, rnd.workload, sampled.device, True)
    assert sampled.source_dir.name not in {round_key(p, rnd.workload, sampled.device) for p in (plan, unfused)}
    _check_sampling_round(rnd.ref, sampled, rnd.inputs)


def test_a_schedule_that_writes_no_logits_cannot_sample(tmp_path):
    from conjugate.compiler.round import compile_round
    from conjugate.plan import expand, validate_plan
    from test_round import _round, _shipped

    rnd = _round("llama")
    plan = validate_plan(_shipped("sequential"))
    with pytest.raises(ValueError, match="fuses lm_head\\+argmax"):
        compile_round(plan, rnd.workload, rnd.draft, rnd.target, cache_dir=tmp_path,
                      schedule=expand(plan, rnd.workload), sampling=True)


def test_a_conventional_round_that_samples():
    from conjugate.compiler.buffers import PreparedWeights
    from conjugate.evaluate.baselines.conventional import ConventionalRound, Variant
    from test_round import _round

    rnd = _round("llama")
    draft, target, eager = PreparedWeights(rnd.draft), PreparedWeights(rnd.target), Variant("eager", "sdpa")
    greedy = ConventionalRound(rnd.workload, draft, target, eager, eager)
    greedy.load(rnd.inputs)
    greedy.run()
    _check_sampling_round(greedy.outputs(), ConventionalRound(rnd.workload, draft, target, eager, eager, sampling=True),
                          rnd.inputs)
