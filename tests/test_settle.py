"""The accept step in one launch (serving/settle.py) against the rules of serving/accept.py, on
random rounds: every draft accepted, none, some; sequences done or padding (not active)."""
from __future__ import annotations

from dataclasses import replace

import pytest
import torch

import conjugate  # noqa: F401  (selects the interpreter before triton is imported)
from conjugate.serving.accept import accept, append_emitted
from conjugate.serving.settle import settle

WIDTH = 20


def _reference(verify_in, verify_out, tokens_in, draft_lengths, target_lengths, out, produced, limit, accepted):
    """accept.py's rules as torch operations, on copies."""
    k = verify_in.shape[1] - 1
    out, produced, accepted = out.clone(), produced.clone(), accepted.clone()
    result = accept(verify_in[:, 1:], verify_out)
    active = produced < limit
    counts = torch.where(active, result.counts, 0)
    accepted += torch.stack([active.sum() * k, torch.where(active, result.drafts_accepted, 0).sum()])
    append_emitted(out, produced, replace(result, counts=counts))
    return (out[:, :WIDTH - 1], produced, torch.where(active, result.last, tokens_in), draft_lengths + counts,
            target_lengths + counts, accepted)


@pytest.mark.parametrize("k,batch", [(1, 3), (4, 5), (5, 4), (8, 2)])
def test_one_launch_keeps_the_rules_of_accept(k, batch):
    g = torch.Generator().manual_seed(k * 10 + batch)
    for trial in range(5):
        verify_in = torch.randint(0, 3, (batch, k + 1), generator=g)  # few token ids: many partial matches
        verify_out = torch.randint(0, 3, (batch, k + 1), generator=g)
        if trial == 0:
            verify_out[:, :k] = verify_in[:, 1:]  # every draft accepted
        if trial == 1:
            verify_out[:, 0] = verify_in[:, 1] + 1  # none accepted
        produced, limit = torch.randint(0, 6, (batch,), generator=g), torch.randint(0, 8, (batch,), generator=g)
        limit[0] = 0  # a padding row: never active
        state = (torch.randint(0, 50, (batch,), generator=g), torch.randint(0, 9, (batch,), generator=g),
                 torch.randint(9, 20, (batch,), generator=g), torch.randint(100, 200, (batch, WIDTH), generator=g),
                 produced, limit, torch.tensor([7, 3]))
        expected = _reference(verify_in, verify_out, *state)
        tokens_in, draft_lengths, target_lengths, out, produced, limit, accepted = (t.clone() for t in state)
        settle(verify_in, verify_out, tokens_in, draft_lengths, target_lengths, out, produced, limit, accepted)
        got = (out[:, :WIDTH - 1], produced, tokens_in, draft_lengths, target_lengths, accepted)
        for name, a, b in zip(("out", "produced", "tokens_in", "draft lengths", "target lengths", "accepted"), got,
                              expected):
            assert torch.equal(a, b), (name, trial, a, b)
        assert torch.equal(out[:, WIDTH - 1], state[3][:, WIDTH - 1])  # nothing lands past the emitted tokens


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
