"""The step table's test cases: a tiny model's random weights with a round's ragged inputs, and the
reference draft phase the simulated tables must reproduce."""
from __future__ import annotations

import torch

from conjugate.compiler.step.simulate import simulate
from conjugate.compiler.step.table import StepProgram, Tiles
from conjugate.models.presets import from_name
from conjugate.models.reference import draft_phase, make_round_inputs
from conjugate.models.weights import random_weights

SMALL = Tiles(k=16, rows=32, half=16)  # the tiny models' sizes: many tiles and slices


def step_case(name: str, batch: int, ragged: bool = True, seed: int = 0):
    w = random_weights(from_name(name), seed=seed)
    inputs = make_round_inputs(w, w, k=3, draft_batch=batch, target_batch=1, context=12, seed=seed, ragged=ragged)
    return w, inputs


def reference_phase(w, inputs, steps):
    """(tokens, logits, cache) of the reference's draft phase on a copy of the inputs' cache."""
    cache = inputs.draft_cache.clone()
    tokens, logits = draft_phase(w, inputs.draft_last_tokens, cache, inputs.draft_lengths, steps)
    return tokens, logits, cache


def assert_simulates_reference(prog: StepProgram, w, inputs, steps: int, seeds=(0, 1)) -> None:
    """The table, run by the simulation in each seed's interleaving of the programs, gives the
    reference's tokens, logits and cache."""
    ref_tokens, ref_logits, ref_cache = reference_phase(w, inputs, steps)
    for seed in seeds:
        out = simulate(prog, w, inputs.draft_last_tokens, inputs.draft_cache, inputs.draft_lengths, seed=seed)
        assert torch.equal(out.tokens, ref_tokens)
        torch.testing.assert_close(out.logits, ref_logits, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(out.cache.k, ref_cache.k, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(out.cache.v, ref_cache.v, rtol=1e-4, atol=1e-4)
