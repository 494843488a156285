"""Compiled rounds under the interpreter equal the reference round, plan by plan."""
from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import conjugate  # noqa: F401  (selects the interpreter before triton is imported)
from conjugate.compiler.feedback import CompileError, CompileFailure, Resources
from conjugate.compiler.gemm import GEMM_TILES, SIGNATURES
from conjugate.compiler.round import compile_round
from conjugate.evaluate.correctness import compare_rounds
from conjugate.models import make_round_inputs, random_weights, reference_round
from conjugate.plan import load_plan, validate_plan
from conjugate.plan.schema import FUSIONS, PATTERNS
from conjugate.roles import Model
from conjugate.workload import workload_from_dict

ROOT = Path(__file__).resolve().parents[1]
FAMILIES = ("llama", "qwen2", "qwen3")
# small tiles keep the interpreter quick while still exercising split-K and split-KV; the interpreter
# pays per program, so qkv (the widest GEMM) takes 128 columns a tile (target qkv still two tiles, a
# quarter of the programs at 32), while down keeps narrow tiles: several N tiles per row, whose partial row
# statistics the fused norms combine
SMALL_TILES = {m: {"qkv": {"BLOCK_M": 16, "BLOCK_N": 128, "BLOCK_K": 64, "SPLIT_K": 2},
                   "down": {"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 64, "SPLIT_K": 2},
                   "attn": {"BLOCK_N": 16, "SPLIT_KV": 2}} for m in ("draft", "target")}


def _workload(family: str, k: int = 2):
    return workload_from_dict({"draft": f"tiny-{family}-d", "target": f"tiny-{family}-t", "k": k, "draft_batch": 2,
                               "target_batch": 2, "context": 5, "dtype": "fp32", "seed": 3}, ROOT / f"{family}.toml")


class _Round:
    """Weights, inputs and the reference of one tiny workload, made once per family."""

    def __init__(self, workload):
        self.workload = w = workload
        self.draft = random_weights(w.draft, w.seed, w.torch_dtype)
        self.target = random_weights(w.target, w.seed, w.torch_dtype)
        self.inputs = make_round_inputs(self.draft, self.target, k=w.k, draft_batch=w.draft_batch,
                                        target_batch=w.target_batch, context=w.context, seed=w.seed)
        self.ref = reference_round(self.draft, self.target, self.inputs)

    def check(self, plan, tmp_path):
        compiled = compile_round(plan, self.workload, self.draft, self.target, cache_dir=tmp_path)
        compiled.load(self.inputs)
        compiled.bufs.poison()
        compiled.run()
        out = compiled.outputs()
        report = compare_rounds(self.ref, out, self.workload.dtype, self.workload.context)
        assert report.ok, report.problems
        assert report.near_ties == 0  # fp32: tokens match exactly
        return compiled, out


_ROUNDS: dict[str, _Round] = {}


def _round(family: str) -> _Round:
    if family not in _ROUNDS:
        _ROUNDS[family] = _Round(_workload(family))
    return _ROUNDS[family]


def _plan(**fields):
    return validate_plan({"schema": "conjugate.plan/1", "tiles": SMALL_TILES} | fields)


def _shipped(name: str, **cross) -> dict:
    """A shipped plan (conjugate.plan/2) as a dict, with the small tiles and the given `cross` keys set."""
    plan = load_plan(ROOT / "plans" / f"{name}.json").to_dict()
    for model in ("draft", "target"):
        plan[model]["tiles"] = copy.deepcopy(SMALL_TILES[model])
    plan["cross"].update(copy.deepcopy(cross))
    return plan


def _fused(plan: dict, draft: list[str], target: list[str]) -> dict:
    """A copy of `plan` with each model's fusions replaced."""
    plan = copy.deepcopy(plan)
    plan["draft"]["fusions"], plan["target"]["fusions"] = list(draft), list(target)
    return plan


@pytest.mark.parametrize("family,plan", [(f, p) for f in FAMILIES for p in ("sequential", "streams", "interleave")])
def test_shipped_plans_compute_the_reference_round(family, plan, tmp_path):
    shipped = load_plan(ROOT / "plans" / f"{plan}.json").to_dict()
    for model in ("draft", "target"):  # the shipped GPU tiles make the interpreter slow
        shipped[model]["tiles"] = SMALL_TILES[model]
    compiled, out = _round(family).check(validate_plan(shipped), tmp_path)
    assert out.draft_logits is None  # lm_head+argmax fused: no logits written
    if plan == "interleave":
        assert any(len(l.parts) == 2 for l in compiled.launches)


@pytest.mark.parametrize("family", FAMILIES)
def test_norm_prologues_and_written_logits(family, tmp_path):
    """Norms folded into the following GEMMs, logits written and compared, argmax separate."""
    fusions = ["attn_norm+qkv", "mlp_norm+gate_up", "final_norm+lm_head"]
    plan = _plan(alignment="proportional", pairs={"qkv": ["*"], "gate_up": ["*"], "attn": ["*"]},
                 fusions={"draft": fusions, "target": fusions})
    rnd = _round(family)
    compiled, out = rnd.check(plan, tmp_path)
    assert out.draft_logits is not None and out.target_logits is not None
    # every norm but layer 0's attn_norm reads the row statistics its residual GEMM wrote
    flags = {c.label: (c.constexprs.get("STATS_OUT", False), c.constexprs.get("STATS_IN", False))
             for launch in compiled.launches for c in launch.parts if c.sig.fn in GEMM_TILES}
    assert {label.split(".")[-1] for label, (_, read) in flags.items() if not read} >= {"o_proj", "down"}
    assert all(read for label, (_, read) in flags.items() if label.endswith(("gate_up", "lm_head")))
    assert all(written for label, (written, _) in flags.items() if label.endswith(("o_proj", "down")))
    assert not any(read for label, (_, read) in flags.items() if ".l0.attn_norm" in label)
    report = compare_rounds(rnd.ref, out, "fp32", rnd.workload.context)
    assert report.errors["draft_logits"] < 1e-4 and report.errors["target_logits"] < 1e-4


@pytest.mark.parametrize("pattern,ratio", [("blocked", [1, 1]), ("strided", [1, 1]), ("ratio", [3, 1]),
                                           ("ratio", [1, 2])])
def test_pinned_cross_model_launches(pattern, ratio, tmp_path):
    """GEMM beside GEMM, attention beside GEMM and a norm beside a GEMM, with per-part tiles."""
    plan = _plan(alignment="proportional", interleave={"pattern": pattern, "ratio": ratio}, overrides=[
        {"match": "t.l0.qkv", "with": "d.s0.l0.qkv",
         "tiles": {"target": {"qkv": {"BLOCK_N": 64, "SPLIT_K": 1}}, "draft": {"qkv": {"BLOCK_N": 16}}}},
        {"match": "t.l0.attn", "with": "d.s0.l0.o_proj"},
        {"match": "t.l0.mlp_norm", "with": "d.s0.l0.gate_up", "tiles": {"draft": {"gate_up": {"BLOCK_K": 32}}}},
    ])
    compiled, _ = _round("qwen2").check(plan, tmp_path)
    pairs = {tuple(p.label.split(".")[-1] for p in l.parts) for l in compiled.launches if len(l.parts) == 2}
    assert pairs == {("qkv", "qkv"), ("attn", "o_proj"), ("mlp_norm", "gate_up")}
    tiles = {p.label: p.constexprs.get("BLOCK_N") for l in compiled.launches for p in l.parts}
    assert tiles["t.l0.qkv"] == 64 and tiles["d.s0.l0.qkv"] == 16
    qkv = next(f for f in compiled.feedback() if f.parts[0].op == "t.l0.qkv")
    launch = compiled.launches[qkv.launch]
    assert [p.model for p in qkv.parts] == [Model.TARGET, Model.DRAFT]
    assert [p.programs for p in qkv.parts] == [call.programs for call in launch.parts]
    assert qkv.kernel == f"k_{launch.digest}.py" and qkv.resources == Resources()  # no GPU report here


def test_kernel_cache_reuses_generated_source(tmp_path):
    rnd = _round("llama")
    plan = _plan()
    first = compile_round(plan, rnd.workload, rnd.draft, rnd.target, cache_dir=tmp_path)
    files = sorted(first.source_dir.glob("k_*.py"))
    stamps = [f.stat().st_mtime_ns for f in files]
    second = compile_round(plan, rnd.workload, rnd.draft, rnd.target, cache_dir=tmp_path)
    assert second.source_dir == first.source_dir and sorted(second.source_dir.glob("k_*.py")) == files
    assert [f.stat().st_mtime_ns for f in files] == stamps  # reused, not rewritten
    assert len(files) < len(first.launches)  # launches with equal constexprs share a kernel
    manifest = json.loads((first.source_dir / "manifest.json").read_text())
    assert len(manifest["launches"]) == len(first.launches)
    assert "@triton.jit" in files[0].read_text()
    other = compile_round(_plan(alignment="greedy", pairs={"qkv": ["*"]}), rnd.workload, rnd.draft, rnd.target,
                          cache_dir=tmp_path)
    assert other.source_dir != first.source_dir  # keyed by plan, workload and device


def test_lowering_errors_are_structured(tmp_path):
    rnd = _round("llama")
    huge = {"BLOCK_M": 256, "BLOCK_N": 512, "BLOCK_K": 512, "num_stages": 4}  # about 3 MB of operand tiles
    plan = _plan(tiles={"target": {"gate_up": huge}})
    with pytest.raises(CompileError) as info:
        compile_round(plan, rnd.workload, rnd.draft, rnd.target, cache_dir=tmp_path)
    failure = info.value.failure
    assert failure.part == 0 and [p.label for p in failure.failed] == ["t.l0.gate_up"]
    assert failure.failed[0].model is Model.TARGET and failure.failed[0].kind == "gate_up"
    assert CompileFailure.from_dict(failure.to_dict()) == failure
    assert str(info.value).startswith(f"launch {failure.launch} part 0 (t.l0.gate_up): tiles need at least ")
    assert "shared memory" in failure.reason


_random_plans = st.fixed_dictionaries({
    "alignment": st.sampled_from(["sequential", "proportional", "greedy"]),
    "pairs": st.dictionaries(st.sampled_from(["qkv", "attn", "o_proj", "gate_up", "down", "rope_kv", "mlp_norm"]),
                             st.just(["*"]), max_size=4),
    "interleave": st.fixed_dictionaries({"pattern": st.sampled_from(PATTERNS),
                                         "ratio": st.lists(st.integers(1, 3), min_size=2, max_size=2)}),
    "fusions": st.fixed_dictionaries({"draft": st.lists(st.sampled_from(FUSIONS), unique=True),
                                      "target": st.lists(st.sampled_from(FUSIONS), unique=True)}),
    "split_k": st.sampled_from([1, 2]),
})


@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(drawn=_random_plans)
def test_random_valid_plans_compute_the_reference_round(drawn, tmp_path):
    split = drawn.pop("split_k")
    tiles = json.loads(json.dumps(SMALL_TILES))
    for model in tiles.values():
        for cfg in model.values():
            if "SPLIT_K" in cfg:
                cfg["SPLIT_K"] = split
    _round("qwen3").check(validate_plan({"schema": "conjugate.plan/1", "tiles": tiles} | drawn), tmp_path)


def test_pack_pair_block_addressing():
    from conjugate.compiler.packed import pack_pair

    w_t, w_d = torch.randn(70, 24), torch.randn(33, 40)  # different N and K, partial last blocks
    buffer, blocks_t, blocks_d = pack_pair(w_t, w_d, block_n=16)
    for w, blocks in ((w_t, blocks_t), (w_d, blocks_d)):
        n, k = w.shape
        for j in range(-(-n // 16)):
            base = blocks.offset + (j * blocks.stride if j < blocks.pairs else blocks.tail_start + (j - blocks.pairs) * 16 * k)
            rows = w[j * 16:(j + 1) * 16]
            assert torch.equal(buffer[base:base + rows.numel()].view(-1, k), rows)
    assert blocks_t.pairs == 3 and blocks_d.offset == 16 * 24  # T0 D0 T1 D1 T2 D2 | T3 T4
    assert buffer.numel() == 5 * 16 * 24 + 3 * 16 * 40


def test_packed_operand_layout(tmp_path):
    """Target and draft GEMMs of different N and K (store with bias, SiLU*mul, residual) through one tile loop."""
    pins = [{"match": "t.l0.qkv", "with": "d.s0.l0.qkv"}, {"match": "t.l0.gate_up", "with": "d.s0.l0.gate_up"},
            {"match": "t.l1.o_proj", "with": "d.s0.l0.down"}]
    plan = _plan(alignment="proportional", operand_layout="packed", interleave={"pattern": "ratio", "ratio": [2, 1]},
                 overrides=pins)
    compiled, _ = _round("qwen2").check(plan, tmp_path)
    packed = [l for l in compiled.launches if len(l.parts) == 2]
    assert len(packed) == 3
    for launch in packed:
        target, draft = launch.parts
        assert draft.args["w_ptr"].data_ptr() > target.args["w_ptr"].data_ptr()  # one buffer, draft blocks after T0
        assert draft.constexprs == target.constexprs  # the homogeneous tile shape
        assert "packed operand layout" in (compiled.source_dir / f"k_{launch.digest}.py").read_text()


def test_packed_layout_needs_matching_gemms(tmp_path):
    rnd = _round("qwen2")
    plan = _plan(alignment="proportional", operand_layout="packed",
                 overrides=[{"match": "t.l0.qkv", "with": "d.s0.l0.down"}])  # store+bias beside residual
    with pytest.raises(CompileError, match="same epilogue, prologue, split-K sum, row statistics and copy") as info:
        compile_round(plan, rnd.workload, rnd.draft, rnd.target, cache_dir=tmp_path)
    failure = info.value.failure
    assert failure.part == 1 and failure.failed[0].label == "d.s0.l0.down" and len(failure.parts) == 2


def test_packed_plan_packs_only_gemm_pairs(tmp_path):
    shipped = _shipped("interleave", operand_layout="packed",
                       pairs={"qkv": ["qkv"], "o_proj": ["o_proj", "down", "attn"], "down": ["*"], "attn": ["*"]})
    compiled, _ = _round("llama").check(validate_plan(shipped), tmp_path)
    kinds = {tuple(p.sig.fn for p in l.parts) for l in compiled.launches if len(l.parts) == 2}
    assert ("gemm_tile", "gemm_tile") in kinds and len(kinds) > 1  # GEMM pairs packed, the others separate


def test_single_draft_token_rounds(tmp_path):
    """k = 1: one decode step, tokens and logits still shaped [B, k]."""
    _Round(_workload("llama", k=1)).check(_plan(alignment="proportional", pairs={"qkv": ["*"]}), tmp_path)


def test_packed_layout_leaves_non_gemm_pairs_separate(tmp_path):
    plan = _plan(alignment="proportional", operand_layout="packed",
                 overrides=[{"match": "t.l0.attn", "with": "d.s0.l0.attn"}])  # different head dims
    compiled, _ = _round("llama").check(plan, tmp_path)
    shared = next(l for l in compiled.launches if len(l.parts) == 2)
    assert shared.parts[0].constexprs["HEAD_DIM"] != shared.parts[1].constexprs["HEAD_DIM"]
    assert "packed operand layout" not in (compiled.source_dir / f"k_{shared.digest}.py").read_text()


def test_unsupported_head_dim_is_a_compile_error(tmp_path):
    from dataclasses import replace

    rnd = _round("llama")
    odd = replace(rnd.workload, target=replace(rnd.workload.target, head_dim=24))
    from conjugate.models import random_weights

    target = random_weights(odd.target, 0)
    with pytest.raises(CompileError, match="head_dim 24 must be a power of two"):
        compile_round(_plan(), odd, rnd.draft, target, cache_dir=tmp_path)


def test_one_wrong_cache_vector_is_caught(tmp_path):
    rnd = _round("qwen3")
    _, out = rnd.check(_plan(), tmp_path)
    context = rnd.workload.context
    out.target_cache.k[1, 0, 0, context + 2] += 0.5 * out.target_cache.k[1, 0, 0, context + 2].abs().max()
    report = compare_rounds(rnd.ref, out, "fp32", context)
    assert not report.ok and any("target cache k: worst (layer, new entry)" in p for p in report.problems)


@pytest.mark.parametrize("model", ["draft", "target"])
def test_a_reference_with_nan_logits_fails_the_check(model):
    """Weights that make a model's logits NaN give token 0 in the reference and in the compiled round
    alike: the check refuses the round, naming the model, instead of passing equal tokens."""
    from conjugate.evaluate.correctness import check_round

    rnd = _round("llama")
    lm_head = (rnd.draft if model == "draft" else rnd.target).lm_head
    kept = lm_head.clone()
    lm_head.fill_(float("nan"))
    try:
        damaged = reference_round(rnd.draft, rnd.target, rnd.inputs)
        report = check_round(rnd.draft, rnd.target, rnd.inputs, damaged, "fp32")
    finally:
        lm_head.copy_(kept)
    assert not report.ok
    assert f"the reference {model} logits hold NaN or infinity: the {model} model's weights are damaged" \
        in report.problems[0]
    assert compare_rounds(rnd.ref, rnd.ref, "fp32", rnd.workload.context).ok  # sound weights: no such problem


def test_teacher_forced_check_follows_the_compiled_tokens(monkeypatch):
    """After a near tie the reference decodes from the compiled token, so later steps still compare."""
    from conjugate.evaluate import correctness
    from conjugate.evaluate.correctness import Tolerance, check_round
    from conjugate.models import reference_round as run_reference

    rnd = _round("llama")
    second_best = rnd.ref.draft_logits[:, 0].topk(2).indices[:, 1]
    forced = rnd.ref.draft_tokens.clone()
    forced[0, 0] = second_best[0]  # sequence 0 takes the runner-up at step 0
    took_tie = run_reference(rnd.draft, rnd.target, rnd.inputs, forced)
    took_tie.draft_tokens[0, 0] = second_best[0]  # as the compiled round would report it
    monkeypatch.setitem(correctness.TOLERANCES, "fp32", Tolerance(rel=1e-4, tie_margin=10.0))  # any token is a tie
    report = check_round(rnd.draft, rnd.target, rnd.inputs, took_tie, "fp32")
    assert report.ok and report.near_ties == 1
    # a round whose later steps did not follow its own token fails the forced comparison
    inconsistent = run_reference(rnd.draft, rnd.target, rnd.inputs)
    inconsistent.draft_tokens[0, 0] = second_best[0]
    assert not check_round(rnd.draft, rnd.target, rnd.inputs, inconsistent, "fp32").ok


@pytest.mark.parametrize("family", FAMILIES)
def test_qkv_with_rope_and_the_cache_write_in_its_epilogue(family, tmp_path):
    """`qkv+rope_kv`: the projection's tiles are heads; bias, QK-norm (qwen3), RoPE and the cache
    write run in its epilogue, with and without the norm prologue and split-K, in shared launches
    too; no rope_kv launch is left."""
    plan = _plan(alignment="proportional", pairs={"qkv": ["*"], "gate_up": ["*"], "attn": ["*"]},
                 fusions={"draft": ["attn_norm+qkv", "qkv+rope_kv"], "target": ["qkv+rope_kv"]})
    compiled, _ = _round(family).check(plan, tmp_path)
    kinds = [(p.kind, p.fused) for l in compiled.schedule.launches for p in l.parts]
    assert not any(kind == "rope_kv" for kind, _ in kinds)
    assert ("qkv", ("attn_norm", "qkv", "rope_kv")) in kinds and ("qkv", ("qkv", "rope_kv")) in kinds
    rope_tiles = [p for l in compiled.launches for p in l.parts if p.sig == SIGNATURES["rope_kv"]]
    spec = _round(family).workload.target
    half_heads = [(-(-p.args["M"] // p.constexprs["BLOCK_M"]), p.args["N"] // (p.constexprs["HEAD_DIM"] // 2),
                   p.constexprs["SPLIT_K"], p.programs) for p in rope_tiles]
    assert rope_tiles and all(m * heads * splits == programs for m, heads, splits, programs in half_heads)  # a tile:
    # one head (its two halves) of a block of rows
    assert any(p.constexprs["SPLIT_K"] == 2 for p in rope_tiles) and spec.head_dim in {p.constexprs["HEAD_DIM"]
                                                                                       for p in rope_tiles}


def test_the_packed_layout_refuses_qkv_with_rope(tmp_path):
    rnd = _round("llama")
    fused = ["qkv+rope_kv"]
    plan = _plan(alignment="proportional", operand_layout="packed", fusions={"draft": fused, "target": fused},
                 overrides=[{"match": "t.l0.qkv", "with": "d.s0.l0.qkv"}])
    with pytest.raises(CompileError, match="cannot hold a qkv\\+rope_kv GEMM"):
        compile_round(plan, rnd.workload, rnd.draft, rnd.target, cache_dir=tmp_path)


def test_a_mixed_plan_computes_the_reference_round(tmp_path):
    """Two streams, one draft op pinned into a target launch (on a CPU the launches run in order)."""
    streams = _shipped("streams", overrides=[{"match": "t.l1.o_proj", "with": "d.s1.l0.down"}])
    compiled, _ = _round("qwen2").check(validate_plan(streams), tmp_path)
    shared = [l for l in compiled.schedule.launches if l.cross_model]
    assert len(shared) == 1 and compiled.waits[shared[0].index]


@pytest.mark.parametrize("family,reduce", [("llama", {"draft": "atomic"}), ("qwen2", {"target": "atomic"}),
                                           ("qwen3", {"draft": "atomic", "target": "atomic"})])
def test_residual_gemms_summing_their_splits_atomically(family, reduce, tmp_path):
    """split_reduce atomic: o_proj's and down's split-K partials added straight into the residual
    stream, in one model or both, in a two-stream plan; the round is still the reference round (each
    family once; the fused norms' test below reads these sums in every family)."""
    tiles = {m: SMALL_TILES[m] | {"o_proj": {"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 16, "SPLIT_K": 4}}
             for m in ("draft", "target")}
    plan = validate_plan({"schema": "conjugate.plan/1", "tiles": tiles, "streams": "two", "split_reduce": reduce})
    compiled, _ = _round(family).check(plan, tmp_path)
    atomic = {(c.label.split(".")[0], c.label.split(".")[-1]) for launch in compiled.launches for c in launch.parts
              if c.constexprs.get("ATOMIC_SPLIT")}
    models = {m[0] for m in reduce}
    assert atomic == {(m, kind) for m in models for kind in ("o_proj", "down")}


@pytest.mark.parametrize("family", FAMILIES)
def test_fused_norms_read_the_statistics_of_residual_gemms_summing_atomically(family, tmp_path):
    """With split_reduce atomic, each residual tile's last split reads its finished rows back and
    writes their statistics, so the draft's fused norms still read them instead of passing over x;
    the round is the reference round."""
    tiles = {m: SMALL_TILES[m] | {"o_proj": {"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 16, "SPLIT_K": 4}}
             for m in ("draft", "target")}
    fused = ["attn_norm+qkv", "mlp_norm+gate_up", "final_norm+lm_head", "lm_head+argmax"]
    plan = validate_plan({"schema": "conjugate.plan/1", "tiles": tiles, "streams": "two",
                          "split_reduce": {"draft": "atomic"}, "fusions": {"draft": fused}})
    compiled, _ = _round(family).check(plan, tmp_path)
    draft = {c.label: c.constexprs for launch in compiled.launches for c in launch.parts if c.label.startswith("d.")}
    residual = [c for label, c in draft.items() if label.endswith(("o_proj", "down"))]
    assert residual and all(c["ATOMIC_SPLIT"] and c["STATS_OUT"] for c in residual)
    readers = [c for label, c in draft.items() if label.endswith(("gate_up", "lm_head")) or ".l1.attn_norm" in label]
    assert readers and all(c["STATS_IN"] for c in readers)
    counters = [c for launch in compiled.launches for c in launch.parts if c.constexprs.get("ATOMIC_SPLIT")]
    assert all(int(c.args["counter_ptr"].abs().sum()) == 0 for c in counters)  # reset for the next launch


@pytest.mark.parametrize("family", FAMILIES)
def test_the_fused_mlp_computes_the_reference_round(family, tmp_path):
    """gate_up+down: each MLP one launch in both models, its ffn blocks adding into the residual stream
    atomically; the draft's fused attn_norm and final_norm read the row statistics it writes."""
    fused = ["gate_up+down", "attn_norm+qkv", "final_norm+lm_head", "lm_head+argmax"]
    plan = _plan(streams="two", fusions={"draft": fused, "target": ["gate_up+down"]})
    compiled, _ = _round(family).check(plan, tmp_path)
    parts = [c for launch in compiled.launches for c in launch.parts]
    mlps = [c for c in parts if c.sig.fn == "mlp_tile"]
    assert len(mlps) == sum(op.endswith(".gate_up") for op in compiled._op_graph.nodes)
    assert not [c for c in parts if c.label.endswith(".down") and c.sig.fn != "mlp_tile"]  # no down launch left
    assert all(c.constexprs["STATS_OUT"] == c.label.startswith("d.") for c in mlps)
    assert all(int(c.args["counter_ptr"].abs().sum()) == 0 for c in mlps)  # reset for the next launch
    assert not any(c.constexprs.get("COPY_OUT") for c in parts)  # the norms' own launches write h


@pytest.mark.parametrize("reduce,more", [
    ("ordered", {}), ("atomic", {}),
    ("atomic", {"pdl": {"draft": {"trigger": "end"}}}),  # a programmatic dependent launch (GPU only)
], ids=["ordered", "atomic", "pdl"])
def test_the_fused_mlp_with_its_norm_reads_the_o_projs_copy_of_the_rows(reduce, more, tmp_path):
    """Every fusion: mlp_norm+gate_up+down is one launch, its norm a prologue over the copy of the
    residual rows and the row statistics that the o_proj before writes (its splits summed in order,
    or atomically and read back by each tile's last split); the round is the reference round."""
    tiles = {m: SMALL_TILES[m] | {"o_proj": {"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 16, "SPLIT_K": 4}}
             for m in ("draft", "target")}
    plan = validate_plan({"schema": "conjugate.plan/1", "tiles": tiles, "streams": "two",
                          "split_reduce": {"draft": reduce}, "fusions": {"draft": list(FUSIONS)}} | more)
    compiled, _ = _round("qwen2").check(plan, tmp_path)
    draft = [c for launch in compiled.launches for c in launch.parts if c.label.startswith("d.")]
    mlps = [c for c in draft if c.sig.fn == "mlp_tile"]
    assert mlps and all(c.constexprs["NORM"] and ".mlp_norm+" in c.label for c in mlps)
    o_proj = [c for c in draft if c.label.endswith("o_proj")]
    assert o_proj and all(c.constexprs["COPY_OUT"] and c.constexprs["STATS_OUT"] for c in o_proj)
    assert all(c.args["copy_ptr"] is mlp.args["x_ptr"] for c, mlp in zip(o_proj, mlps))
    assert not [c for c in draft if "mlp_norm" in c.label and c.sig.fn != "mlp_tile"]  # no norm launch left


def test_the_fused_mlp_shares_a_launch(tmp_path):
    """The fused MLP as one part beside the other model's parts in interleaved launches (the separate
    operand layout: there are no GEMM weights to pack)."""
    fused = ["gate_up+down", "lm_head+argmax"]
    plan = validate_plan(_fused(_shipped("interleave"), draft=fused, target=fused))
    compiled, _ = _round("qwen3").check(plan, tmp_path)
    holding = [launch for launch in compiled.launches if any(c.sig.fn == "mlp_tile" for c in launch.parts)]
    assert any(len(launch.parts) > 1 for launch in holding)


def test_a_packed_launch_needs_both_models_row_statistics_alike(tmp_path):
    """Packed, both GEMMs run the target's flags: a draft o_proj that must write the row statistics its
    fused norm reads, beside a target o_proj that writes none, is a compile error naming them (run
    with the target's flags it left the draft's norm reading stale statistics)."""
    rnd = _round("llama")
    pinned = _shipped("interleave", overrides=[{"match": "t.l0.o_proj", "with": "d.s0.l0.o_proj",
                                                "operand_layout": "packed"}])
    normed = ["lm_head+argmax", "mlp_norm+gate_up"]
    plan = _fused(pinned, draft=normed, target=["lm_head+argmax"])
    with pytest.raises(CompileError, match="differ in STATS_OUT"):
        compile_round(validate_plan(plan), rnd.workload, rnd.draft, rnd.target, cache_dir=tmp_path)
    compiled, _ = rnd.check(validate_plan(_fused(pinned, draft=normed, target=normed)), tmp_path)
    packed = next(l for l in compiled.launches if len(l.parts) == 2 and l.parts[0].label == "t.l0.o_proj")
    assert [p.constexprs["STATS_OUT"] for p in packed.parts] == [True, True]


def test_a_packed_launch_needs_both_models_copies_of_the_rows_alike(tmp_path):
    """Packed o_proj GEMMs run the target's flags: a draft o_proj that must copy its rows for the fused
    MLP after it, beside a target o_proj that copies none, is a compile error naming it; both copying
    computes the reference round."""
    rnd = _round("llama")
    mlp = ["lm_head+argmax", "mlp_norm+gate_up", "gate_up+down"]
    pinned = _shipped("interleave", overrides=[{"match": "t.l0.o_proj", "with": "d.s0.l0.o_proj",
                                                "operand_layout": "packed"}])
    plan = _fused(pinned, draft=mlp, target=["lm_head+argmax", "mlp_norm+gate_up"])
    with pytest.raises(CompileError, match="differ in COPY_OUT"):
        compile_round(validate_plan(plan), rnd.workload, rnd.draft, rnd.target, cache_dir=tmp_path)
    compiled, _ = rnd.check(validate_plan(_fused(pinned, draft=mlp, target=mlp)), tmp_path)
    packed = next(l for l in compiled.launches if len(l.parts) == 2 and l.parts[0].label == "t.l0.o_proj")
    assert [p.constexprs["COPY_OUT"] for p in packed.parts] == [True, True]


def test_a_packed_launch_sums_both_models_splits_one_way(tmp_path):
    """Packed, a target o_proj and a draft down run one tile loop: their split-K sums must agree
    (a compile error naming it when they do not), and both atomic computes the reference round."""
    rnd = _round("qwen2")
    tiles = {m: SMALL_TILES[m] | {"o_proj": {"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 16, "SPLIT_K": 4}}
             for m in ("draft", "target")}
    pinned = dict(alignment="proportional", operand_layout="packed", tiles=tiles,
                  overrides=[{"match": "t.l1.o_proj", "with": "d.s0.l0.down"}])
    with pytest.raises(CompileError, match="differ in ATOMIC_SPLIT"):
        compile_round(_plan(**pinned, split_reduce={"draft": "atomic"}), rnd.workload, rnd.draft, rnd.target,
                      cache_dir=tmp_path)
    compiled, _ = rnd.check(_plan(**pinned, split_reduce={"draft": "atomic", "target": "atomic"}), tmp_path)
    shared = next(l for l in compiled.launches if len(l.parts) == 2 and l.parts[0].label == "t.l1.o_proj")
    assert [p.constexprs["ATOMIC_SPLIT"] for p in shared.parts] == [True, True]
