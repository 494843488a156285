"""The accept step in one launch (serving/settle.py) against the rules of serving/accept.py, on
random rounds: every draft accepted, none, some; sequences done or padding (not active). Stop ids are the engine's (serving/engine.py).
Sampled rows: tests/test_sampling.py."""
from __future__ import annotations

from dataclasses import replace

import pytest
import torch

import conjugate  # noqa: F401  (selects the interpreter before triton is imported)
from conjugate.compiler.sampling import SamplingRows
from conjugate.serving.accept import Accepted, accept, append_emitted
from conjugate.serving.settle import settle

WIDTH = 20


STATE = ("out", "produced", "tokens_in", "draft_lengths", "target_lengths", "accepted", "limit", "fresh")


def reference_settle(verify_in, verify_out, tokens_in, draft_lengths, target_lengths, out, produced, limit, accepted,
                     result: Accepted | None = None) -> dict:
    """accept.py's rules as torch operations, on copies -> the state settle leaves (STATE). result:
    what the rows emit where not the greedy rule's (sampled rows)."""
    k = verify_in.shape[1] - 1
    out, produced, accepted = out.clone(), produced.clone(), accepted.clone()
    result = result or accept(verify_in[:, 1:], verify_out)
    active = produced < limit
    counts = torch.where(active, result.counts, 0)
    accepted += torch.stack([active.sum() * k, torch.where(active, result.drafts_accepted, 0).sum()])
    append_emitted(out, produced, replace(result, counts=counts))
    j = torch.arange(k)
    fresh = torch.cat([counts[:, None], torch.where(j < counts[:, None], result.tokens, -1)], 1)
    return dict(zip(STATE, (out[:, :WIDTH - 1], produced, torch.where(active, result.last, tokens_in),
                            draft_lengths + counts, target_lengths + counts, accepted, limit, fresh)))


def random_state(g: torch.Generator, batch: int) -> tuple:
    """tokens_in, draft and target lengths, out, produced, limit, accepted of a group; row 0 padding."""
    produced, limit = torch.randint(0, 6, (batch,), generator=g), torch.randint(0, 8, (batch,), generator=g)
    limit[0] = 0  # a padding row: never active
    lengths = torch.randint(0, 9, (batch,), generator=g)
    return (torch.randint(0, 50, (batch,), generator=g), lengths, lengths.clone(),
            torch.randint(100, 200, (batch, WIDTH), generator=g), produced, limit, torch.tensor([7, 3]))


def run_settle(verify_in, verify_out, state: tuple, **options) -> dict:
    """settle on copies of `state` -> the state it leaves (STATE)."""
    tokens_in, draft_lengths, target_lengths, out, produced, limit, accepted = (t.clone() for t in state)
    fresh = torch.full((verify_in.shape[0], verify_in.shape[1]), -7, dtype=torch.int64)
    settle(verify_in, verify_out, tokens_in, draft_lengths, target_lengths, out, produced, limit, accepted,
           fresh=fresh, **options)
    assert torch.equal(out[:, WIDTH - 1], state[3][:, WIDTH - 1])  # nothing lands past the emitted tokens
    return dict(zip(STATE, (out[:, :WIDTH - 1], produced, tokens_in, draft_lengths, target_lengths, accepted, limit,
                            fresh)))


def assert_same(got: dict, expected: dict, rows=slice(None)) -> None:
    for name in STATE:
        a, b = (got[name], expected[name]) if name == "accepted" else (got[name][rows], expected[name][rows])
        assert torch.equal(a, b), (name, a, b)


def _rounds(g: torch.Generator, k: int, batch: int, trial: int) -> tuple[torch.Tensor, torch.Tensor]:
    verify_in = torch.randint(0, 3, (batch, k + 1), generator=g)  # few token ids: many partial matches
    verify_out = torch.randint(0, 3, (batch, k + 1), generator=g)
    if trial == 0:
        verify_out[:, :k] = verify_in[:, 1:]  # every draft accepted
    if trial == 1:
        verify_out[:, 0] = verify_in[:, 1] + 1  # none accepted
    return verify_in, verify_out


@pytest.mark.parametrize("k,batch", [(1, 3), (4, 5), (5, 4), (8, 2)])
def test_one_launch_keeps_the_rules_of_accept(k, batch):
    g = torch.Generator().manual_seed(k * 10 + batch)
    for trial in range(5):
        verify_in, verify_out = _rounds(g, k, batch, trial)
        state = random_state(g, batch)
        assert_same(run_settle(verify_in, verify_out, state), reference_settle(verify_in, verify_out, *state))


def test_greedy_rows_settle_alike_with_sampling_rows():
    """Sampling rows at temperature 0 (random cuts and seeds beside) change nothing."""
    g = torch.Generator().manual_seed(5)
    k, batch, vocab = 3, 6, 8
    verify_in, verify_out = _rounds(g, k, batch, 4)
    state = random_state(g, batch)
    rows = SamplingRows.allocate(batch, "cpu")
    rows.top_k[:], rows.top_p[:], rows.seed[:] = 2, 0.5, torch.arange(batch)
    logits = dict(draft_logits=torch.randn(batch, k, vocab, generator=g),
                  target_logits=torch.randn(batch * (k + 1), vocab, generator=g))
    assert_same(run_settle(verify_in, verify_out, state, sampling=rows, **logits),
                run_settle(verify_in, verify_out, state))


def test_rows_that_are_not_contiguous_are_refused():
    rows = torch.zeros(3, 10, dtype=torch.int64)[:, :5]
    ok = torch.zeros(3, 5, dtype=torch.int64)
    vec = torch.zeros(3, dtype=torch.int64)
    with pytest.raises(ValueError, match="verify_in must hold its"):
        settle(rows, ok, vec, vec, vec, torch.zeros(3, 8, dtype=torch.int64), vec, vec, torch.zeros(2, dtype=torch.int64))


def test_state_vectors_must_be_contiguous():
    vec = torch.zeros(3, dtype=torch.int64)
    with pytest.raises(ValueError, match="produced must be one contiguous vector"):
        settle(torch.zeros(3, 5, dtype=torch.int64), torch.zeros(3, 5, dtype=torch.int64), vec, vec, vec,
               torch.zeros(3, 8, dtype=torch.int64), torch.zeros(3, 2, dtype=torch.int64)[:, 0], vec,
               torch.zeros(2, dtype=torch.int64))
