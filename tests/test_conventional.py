"""The conventional baseline's static-shape model steps compute the reference round."""
from __future__ import annotations

import pytest
import torch

import conjugate  # noqa: F401
from conjugate.evaluate.conventional import ConventionalRound, compile_static
from conjugate.evaluate.correctness import compare_rounds
from test_round import FAMILIES, _round


@pytest.mark.parametrize("family", FAMILIES)
def test_static_steps_equal_the_reference(family):
    rnd = _round(family)
    before = rnd.inputs.draft_cache.k.clone(), rnd.inputs.target_cache.v.clone()
    conventional = ConventionalRound(rnd.draft, rnd.target, rnd.inputs, compile_fn=lambda fn: fn)
    for _ in range(2):  # a second round over the same buffers gives the same result
        conventional.run()
        report = compare_rounds(rnd.ref, conventional.outputs(), "fp32", rnd.workload.context)
        assert report.ok and report.near_ties == 0, report.problems
    assert torch.equal(rnd.inputs.draft_cache.k, before[0]) and torch.equal(rnd.inputs.target_cache.v, before[1])


def test_torch_compile_for_many_models_in_one_process():
    """More distinct step shapes than dynamo's default recompile limit (8): every one compiled, none eager."""
    from torch._dynamo.utils import counters

    from conjugate.models import make_round_inputs, random_weights, reference_round

    workload = _round("qwen3").workload
    graphs = counters["stats"]["unique_graphs"]
    for seed in range(5):
        draft, target = random_weights(workload.draft, seed), random_weights(workload.target, seed)
        batch = seed + 1  # a new batch size: new shapes, a new graph for each step
        inputs = make_round_inputs(draft, target, k=workload.k, draft_batch=batch, target_batch=batch, context=5,
                                   seed=seed)
        conventional = ConventionalRound(draft, target, inputs, compile_fn=compile_static)
        conventional.run()
        assert compare_rounds(reference_round(draft, target, inputs), conventional.outputs(), "fp32", 5).ok
    assert counters["stats"]["unique_graphs"] - graphs >= 2 * 5  # a graph per step shape, past the limit of 8


@pytest.mark.parametrize("family", FAMILIES)
def test_bf16_steps_hold_the_bf16_tolerance(family):
    """In bf16 the GEMMs and the cache round to bf16 while norms, softmax and the residual stream
    stay fp32; the round must stay within the bf16 tolerance of the fp32 reference."""
    from conjugate.models import make_round_inputs, random_weights, reference_round

    workload = _round(family).workload
    draft, target = (random_weights(spec, 3, dtype=torch.bfloat16) for spec in (workload.draft, workload.target))
    inputs = make_round_inputs(draft, target, k=workload.k, draft_batch=2, target_batch=2, context=5, seed=3)
    conventional = ConventionalRound(draft, target, inputs, compile_fn=lambda fn: fn)
    conventional.run()
    assert conventional.draft_cache.k.dtype == torch.bfloat16
    report = compare_rounds(reference_round(draft, target, inputs, conventional.draft_tokens), conventional.outputs(),
                            "bf16", 5)
    assert report.ok, report.problems
    assert 0 < report.errors["target_logits"] < 0.05  # rounded, so not exact, and within tolerance
