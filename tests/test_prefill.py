"""The serving prefill (serving/prefill.py): prompts of different lengths, batched and right-padded,
leave each row's cache as the reference forward leaves it, one prompt at a time; rows not admitted
are left alone. On a GPU (the device's run) with bf16 weights, within bf16 rounding."""
from __future__ import annotations

import pytest
import torch

from conjugate.models.presets import PRESETS
from conjugate.models.reference import KVCache, forward
from conjugate.models.weights import random_weights
from conjugate.serving.prefill import prefill, prefill_batches

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def test_batches_sort_by_length_keep_the_budget_and_skip_empty_prompts():
    prompts = {0: [1] * 5, 1: [], 2: [1] * 2, 3: [1] * 9, 4: [1] * 3, 5: [1] * 40}
    batches = prefill_batches(prompts, budget=24)
    assert sorted(r for b in batches for r in b) == [0, 2, 3, 4, 5]
    assert batches == [[2, 4, 0], [3], [5]]  # 3 x 5 = 15; 2 x 9 = 18 fits but 4 x 9 does not; 40 alone
    for batch in batches[:-1]:
        assert len(batch) * max(len(prompts[r]) for r in batch) <= 24


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", ["tiny-llama-t", "tiny-qwen2-t", "tiny-qwen3-t"])
def test_batched_prefill_writes_each_row_as_the_reference_does(name, device):
    spec = PRESETS[name]
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    w = random_weights(spec, seed=5, dtype=dtype, device=device)
    gen = torch.Generator().manual_seed(0)
    prompts = {0: torch.randint(0, spec.vocab_size, (7,), generator=gen).tolist(),
               2: torch.randint(0, spec.vocab_size, (1,), generator=gen).tolist(),
               3: torch.randint(0, spec.vocab_size, (13,), generator=gen).tolist(),
               5: []}
    capacity = 16
    got = KVCache.empty(spec, 6, capacity, dtype, device)
    sentinel = 7.0
    got.k.fill_(sentinel), got.v.fill_(sentinel)
    prefill(w, got, prompts, budget=16)  # rows 2 and 0 together (2 x 7), row 3 alone
    for row, ids in prompts.items():
        n = len(ids)
        if n:
            want = KVCache.empty(spec, 1, capacity, dtype, device)
            forward(w, torch.tensor([ids], device=device), want, 0)
            pairs = ((got.k[:, row, :, :n], want.k[:, 0, :, :n]), (got.v[:, row, :, :n], want.v[:, 0, :, :n]))
            for mine, theirs in pairs:
                if dtype == torch.bfloat16:  # bf16 products against fp32 ones: a few bf16 steps of the largest
                    assert (mine.float() - theirs.float()).abs().max() <= 2e-2 * theirs.float().abs().max()
                else:
                    torch.testing.assert_close(mine, theirs, atol=1e-5, rtol=1e-5)
    for row in (1, 4, 5):  # not admitted, or nothing to prefill: untouched
        assert bool((got.k[:, row] == sentinel).all()) and bool((got.v[:, row] == sentinel).all())
