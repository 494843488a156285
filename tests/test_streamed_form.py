"""The streamed launch form (`<model>.streamed`: o_proj and down by kernels/streamed.py) through the
product on the CPU: the plan field, the schedule's Streamed launches, rounds computing the reference
round (the kernel's arithmetic emulated in torch), the emulation against the tile kernel's epilogue,
what it refuses, the heuristic's edits, and the Gluon kernel compiled for sm_90a."""
from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import triton

from conjugate.agents.heuristic.streamed import streamed_edits
from conjugate.compiler.buffers import ModelBuffers, PreparedWeights, padded_rows
from conjugate.compiler.cache import KernelCache
from conjugate.compiler.feedback import CompileError
from conjugate.compiler.lower import lower_part
from conjugate.compiler.round import CompiledLaunch, compile_round
from conjugate.compiler.streamed import CompiledStreamed
from conjugate.errors import PlanError
from conjugate.evaluate.correctness import compare_rounds
from conjugate.graph import build_graph
from conjugate.models.reference import make_round_inputs, reference_round
from conjugate.models.weights import meta_weights, random_weights
from conjugate.plan import expand, load_plan, patch_plan, validate_plan
from conjugate.plan.launch import Part, Pdl, Split, Streamed
from conjugate.roles import Model
from conjugate.workload import load_workload, workload_from_dict

ROOT = Path(__file__).resolve().parents[1]
TINY = load_workload(ROOT / "examples" / "tiny.toml")
NORMS = ["attn_norm+qkv", "mlp_norm+gate_up", "final_norm+lm_head", "lm_head+argmax"]


def _plan(base: str = "sequential", target=("down", "o_proj"), draft=(), fusions=None, **cross) -> dict:
    plan = load_plan(ROOT / "plans" / f"{base}.json").to_dict()
    plan["target"]["streamed"], plan["draft"]["streamed"] = list(target), list(draft)
    if fusions is not None:
        plan["target"]["fusions"] = plan["draft"]["fusions"] = list(fusions)
    plan["cross"].update(cross)
    return plan


def test_the_field_takes_the_residual_gemms_and_keeps_older_hashes():
    assert validate_plan(_plan()).model(Model.TARGET).streamed == ("down", "o_proj")
    with pytest.raises(PlanError, match=r"\$\.target\.streamed\[0\]: \"qkv\" is not one of o_proj, down"):
        validate_plan(_plan(target=("qkv",)))
    raw = json.loads((ROOT / "plans" / "sequential.json").read_text())
    assert "streamed" not in raw["target"]
    stated = json.loads(json.dumps(raw))
    stated["target"]["streamed"] = []
    assert validate_plan(raw).hash == validate_plan(stated).hash != validate_plan(_plan()).hash
    import jsonschema  # plans/plan.schema.json says the same

    schema = json.loads((ROOT / "plans" / "plan.schema.json").read_text())
    jsonschema.validate(_plan(), schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(_plan(target=("gate_up",)), schema)


def test_the_schedule_streams_the_kinds_where_a_launch_holds_them_alone():
    plan = _plan()
    plan["target"]["pdl"] = "start"
    schedule = expand(validate_plan(plan), TINY)
    streamed = [l for l in schedule.launches if isinstance(l.form, Streamed)]
    layers = TINY.weights(Model.TARGET).spec.num_layers
    assert sorted(l.ops[0].split(".")[-1] for l in streamed) == ["down"] * layers + ["o_proj"] * layers
    assert all(l.parts[0].model == Model.TARGET and l.pdl == Pdl.START for l in streamed)  # the model's trigger
    assert not any(isinstance(l.form, Streamed) for l in schedule.launches if l.ops[0].startswith("d."))
    shared = expand(validate_plan(_plan("interleave", draft=("down", "o_proj"))), TINY)
    for launch in shared.launches:  # a launch shared with the other model keeps the tile kernel
        kinds = {p.kind for p in launch.parts}
        if len(launch.parts) == 2:
            assert isinstance(launch.form, Split)
        elif kinds <= {"o_proj", "down"}:
            assert isinstance(launch.form, Streamed)
    fused = expand(validate_plan(_plan(fusions=NORMS + ["gate_up+down"])), TINY)  # down inside the fused MLP
    assert {l.parts[0].kind for l in fused.launches if isinstance(l.form, Streamed)} == {"o_proj"}
    assert fused.warnings == ("$.target.streamed: no down runs as the streamed kernel (every down is fused into "
                              "another op or shares its launch with the other model)", )
    assert schedule.warnings == ()
    step = _plan(draft=("o_proj", ))
    step["draft"]["form"] = "step"
    assert expand(validate_plan(step), TINY).warnings == (
        "$.draft.streamed: no o_proj runs as the streamed kernel (the draft runs as one step launch)", )


def _workload(family: str, dtype: str = "fp32"):
    return workload_from_dict({"draft": f"tiny-{family}-d", "target": f"tiny-{family}-t", "k": 3,
                               "draft_batch": 3, "target_batch": 2, "context": 9, "dtype": dtype, "seed": 5},
                              ROOT / f"{family}.toml")


def test_an_override_setting_tiles_of_a_streamed_launch_is_a_warning():
    plan = _plan(target=("down", ), overrides=[
        {"match": "t.l*.down", "tiles": {"target": {"down": {"BLOCK_N": 32}}}},  # every layer's: streamed
        {"match": "t.l0.down", "launch": {"num_warps": 8}},
        {"match": "t.l*.o_proj", "tiles": {"target": {"o_proj": {"BLOCK_N": 32}}}},  # the tile kernel's
        {"match": "t.l0.down", "pdl": "end"}])  # the streamed launch takes the trigger
    schedule = expand(validate_plan(plan), TINY)
    layers = TINY.weights(Model.TARGET).spec.num_layers
    assert schedule.warnings == (
        f"$.cross.overrides[0]: 't.l*.down' sets tiles or launch parameters of {layers} launch(es) run by the "
        "streamed kernel (t.l0.down, ...), which takes neither",
        "$.cross.overrides[1]: 't.l0.down' sets tiles or launch parameters of 1 launch(es) run by the streamed "
        "kernel (t.l0.down), which takes neither")
    assert next(l for l in schedule.launches if l.ops == ("t.l0.down", )).pdl == Pdl.END


@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3"])
@pytest.mark.parametrize("fusions", [None, NORMS, NORMS + ["gate_up+down"]], ids=["plain", "norms", "fused-mlp"])
def test_a_streamed_round_computes_the_reference_round(family, fusions, tmp_path):
    """Ragged lengths, both models streamed: the tokens and caches are the reference's, with the row
    statistics the fused norms read and the o_proj's copy of the rows for a fused MLP."""
    wl = _workload(family)
    draft, target = random_weights(wl.draft, wl.seed, wl.torch_dtype), random_weights(wl.target, wl.seed, wl.torch_dtype)
    inputs = make_round_inputs(draft, target, k=wl.k, draft_batch=wl.draft_batch, target_batch=wl.target_batch,
                               context=wl.context, seed=wl.seed, ragged=True)
    plan = validate_plan(_plan(draft=("down", "o_proj"), fusions=fusions))
    compiled = compile_round(plan, wl, draft, target, cache_dir=tmp_path)
    assert sum(isinstance(l, CompiledStreamed) for l in compiled.launches) >= 2
    compiled.load(inputs)
    compiled.bufs.poison()
    compiled.run()
    report = compare_rounds(reference_round(draft, target, inputs), compiled.outputs(), wl.dtype,
                            (inputs.draft_lengths, inputs.target_lengths))
    assert report.ok, report.problems
    manifest = json.loads((compiled.source_dir / "manifest.json").read_text())
    kernels = {l["kernel"] for l in manifest["launches"]}
    assert "conjugate/kernels/streamed.py" in kernels and len(kernels) > 1
    feedback = {f.launch: f for f in compiled.feedback()}
    streamed = next(l for l in compiled.launches if isinstance(l, CompiledStreamed))
    assert feedback[streamed.index].parts[0].kind in ("o_proj", "down")


@pytest.mark.parametrize("kind, norm_stats, mlp_fused", [
    ("o_proj", ("mlp_norm", ), False), ("o_proj", ("mlp_norm", ), True), ("down", ("attn_norm", ), False),
    ("down", (), False)])
def test_the_emulation_writes_what_the_tile_kernel_writes(kind, norm_stats, mlp_fused, tmp_path):
    """The residual stream, its row statistics and the copy of the rows, against the tile kernel's
    residual epilogue on the same inputs: every buffer compared, so neither writes what the other
    leaves (statistics and copy only where asked)."""
    wl = _workload("llama")
    weights = random_weights(wl.target, 7, torch.float32)
    graph = build_graph(wl)
    op_id = f"t.l0.{kind}"
    op = graph.nodes[op_id]["op"]
    part = Part(Model.TARGET, (op_id, ), kind, (kind, ), {"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 32, "SPLIT_K": 1},
                norm_stats=norm_stats, mlp_fused=mlp_fused)
    outs = []
    for streamed in (False, True):
        bufs = ModelBuffers.allocate(PreparedWeights(weights), 2, 4, 1, 20, Model.TARGET)
        gen = torch.Generator().manual_seed(3)
        for name, t in bufs.act.items():
            t.copy_(torch.randn(t.shape, generator=gen))
        initial = {name: bufs.act[name].clone() for name in ("stats", "h")}
        if streamed:
            launch = CompiledStreamed.build(0, part, op, bufs, "main", 132)
        else:  # lower_part asks the round's buffers for the model's
            launch = CompiledLaunch.alone(0, lower_part(part, graph, SimpleNamespace(model=lambda _: bufs)),
                                          KernelCache(tmp_path))
        launch()
        outs.append({name: bufs.act[name].clone() for name in ("x", "stats", "h")})
    tile, streamed = outs
    torch.testing.assert_close(streamed["x"], tile["x"], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(streamed["stats"], tile["stats"], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(streamed["h"], tile["h"], rtol=1e-5, atol=1e-5)
    assert torch.equal(streamed["stats"], initial["stats"]) != bool(norm_stats)  # written only where asked
    assert torch.equal(streamed["h"], initial["h"]) != mlp_fused


def test_the_padded_activation_rows_stay_zero_past_the_pass(tmp_path):
    bufs = ModelBuffers.allocate(PreparedWeights(random_weights(_workload("llama").target, 1, torch.float32)), 3, 5, 1,
                                 20, Model.TARGET)
    assert [padded_rows(r) for r in (1, 15, 16, 17, 100, 128, 129)] == [16, 16, 16, 32, 128, 128, 129]
    for name in ("attn_out", "mlp"):
        base = bufs.padded(name)
        assert base.shape[0] == 16 and bufs.act[name].data_ptr() == base.data_ptr()
        bufs.act[name].fill_(float("nan"))  # what poison() does to the pass's rows
        assert torch.equal(base[15:], torch.zeros_like(base[15:]))


def test_what_the_kernel_cannot_run_is_a_compile_error(tmp_path):
    plan = validate_plan(_plan())

    def compiled(wl, dtype):
        return compile_round(plan, wl, meta_weights(wl.draft, dtype), meta_weights(wl.target, dtype),
                             cache_dir=tmp_path)

    with pytest.raises(CompileError, match="multiplies bf16"):
        compiled(TINY, torch.float32)
    b32 = load_workload(ROOT / "examples" / "llama-1b-8b-b32.toml")
    assert sum(isinstance(l, CompiledStreamed) for l in compiled(b32, torch.bfloat16).launches) == 64  # 128 rows
    with pytest.raises(CompileError, match="up to 128 activation rows; this pass has 132"):
        compiled(dataclasses.replace(b32, target_batch=33), torch.bfloat16)


def test_the_heuristic_proposes_the_target_streamed_where_it_can_run():
    plan = load_plan(ROOT / "plans" / "sequential.json")
    (edit, ) = streamed_edits(plan, TINY.to_dict())
    assert edit.kind == "streamed" and "streamed kernel" in edit.rationale
    made = patch_plan(plan, edit.patch)
    assert made.model(Model.TARGET).streamed == ("down", "o_proj")
    (back, ) = streamed_edits(made, TINY.to_dict())
    assert patch_plan(made, back.patch).model(Model.TARGET).streamed == ()
    assert streamed_edits(plan, TINY.to_dict() | {"target_batch": 40, "k": 3}) == []  # 160 rows a pass
    assert streamed_edits(plan, TINY.to_dict() | {"dtype": "fp16"}) == []


STREAMED_COMPILE = """
import torch
from pathlib import Path
import tempfile
from conjugate.compiler.offline import compile_resources
from conjugate.compiler.round import compile_round
from conjugate.compiler.streamed import CompiledStreamed
from conjugate.models.weights import meta_weights
from conjugate.plan import load_plan, validate_plan
from conjugate.workload import load_workload

for name, fusions, pdl in (("llama-1b-8b-b8", ["attn_norm+qkv", "mlp_norm+gate_up", "gate_up+down"], "start"),
                           ("llama-1b-8b-b32", ["attn_norm+qkv", "mlp_norm+gate_up"], "end")):  # 40, 128 rows
    w = load_workload(Path(f"examples/{name}.toml"))
    plan = load_plan(Path("plans/sequential.json")).to_dict()
    plan["target"]["streamed"] = ["down", "o_proj"]
    plan["target"]["fusions"] = fusions
    plan["target"]["pdl"] = pdl
    if pdl == "end":  # o_proj launched plainly
        plan["cross"]["overrides"] = [{"match": "t.l*.o_proj", "pdl": "none"}]
    compiled = compile_round(validate_plan(plan), w, meta_weights(w.draft, torch.bfloat16),
                             meta_weights(w.target, torch.bfloat16), cache_dir=Path(tempfile.mkdtemp()))
    seen = set()
    for launch, r in zip(compiled.launches, compile_resources(compiled)):
        if isinstance(launch, CompiledStreamed) and launch.parts[0].label.split(".")[-1] not in seen:
            seen.add(launch.parts[0].label.split(".")[-1])
            print(launch.rows, launch.parts[0].label, launch.num_warps, r.registers, r.spills, r.shared_bytes,
                  launch.manifest()["pdl_trigger"])
"""


@pytest.mark.skipif(not (Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas").exists(),
                    reason="this Triton bundles no ptxas")
def test_the_streamed_kernel_compiles_for_hopper(tmp_path):
    """At 40 rows (one warpgroup) o_proj with its copy of the rows for a fused MLP (down inside it), a
    programmatic dependent launch released at the start; at 128 (two warpgroups) o_proj launched
    plainly and down released at the end, both with the row statistics: within a program's registers,
    no local memory, Hopper's shared memory. Under PDL both partitions wait for the kernel before ahead
    of their first load (in the PTX's order), and release the next right after the wait or after the
    last store; the plain launch does neither."""
    env = os.environ | {"TRITON_INTERPRET": "0", "TRITON_CACHE_DIR": str(tmp_path)}
    proc = subprocess.run([sys.executable, "-c", STREAMED_COMPILE], capture_output=True, text=True, env=env,
                          cwd=ROOT, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = [line.split() for line in proc.stdout.splitlines()]
    assert [(r[0], r[1].split(".")[-1], r[2], r[6]) for r in rows] == [
        ("40", "o_proj", "4", "start"), ("128", "o_proj", "8", "none"), ("128", "down", "8", "end")]
    for _, _, _, regs, spills, shared, _ in rows:
        assert int(regs) <= 168 and int(spills) == 0 and 100_000 < int(shared) <= 232_448
    # o_proj at 40 rows; o_proj, down and the last layer's down (no statistics) at 128
    triggers = sorted(_ptx_trigger(p.read_text()) for p in tmp_path.rglob("streamed_residual_kernel.ptx"))
    assert triggers == ["end", "end", "none", "start"]


def _ptx_trigger(ptx: str) -> str:
    """The PDL trigger a streamed kernel's PTX implements, checked against the order of its lines."""
    lines = ptx.splitlines()

    def at(text: str) -> list[int]:
        return [n for n, line in enumerate(lines) if text in line]

    waits, releases = at("griddepcontrol.wait"), at("griddepcontrol.launch_dependents")
    loads, stores = at("cp.async.bulk.tensor") + at("ld.global"), at("st.global")
    if not waits and not releases:
        return "none"
    assert len(waits) == 2 and max(waits) < min(loads), "each partition waits before its first load"
    assert len(releases) == 1
    if releases[0] < min(loads + stores):
        return "start"
    assert releases[0] > max(stores)
    return "end"


def test_a_failure_of_a_streamed_launch_is_repaired_by_the_tile_kernel():
    """The blamed kind goes back to the tile kernel first (the other stays streamed); a failure naming
    the kernel but no part offers every streamed kind back, lower."""
    from conjugate.agents.heuristic.repair import repair_edits
    from conjugate.compiler.feedback import CompileFailure, PartRef
    from conjugate.evaluate.result import EvalResult, Stage, Status

    plan = validate_plan(_plan())
    launch = next(l for l in expand(plan, TINY).launches if isinstance(l.form, Streamed) and l.parts[0].kind == "down")
    blamed = CompileFailure(launch.index, 0, (PartRef.of(launch.parts[0], 4), ),
                            "the streamed kernel needs a Hopper GPU (sm_90); this one is sm_80")
    failed = EvalResult(plan.hash, TINY.name, "analytical", Stage.COMPILE, Status.COMPILE_ERROR, True,
                        compile_failure=blamed, error=blamed.message)
    first = repair_edits(plan, failed)[0]
    assert first.kind == "streamed" and first.score == 1.0 and "streamed down" in first.rationale
    assert patch_plan(plan, first.patch).model(Model.TARGET).streamed == ("o_proj", )
    vague = EvalResult(plan.hash, TINY.name, "analytical", Stage.COMPILE, Status.COMPILE_ERROR, True,
                       error="the streamed kernel's TMA descriptors: bad alignment")
    (back, ) = [c for c in repair_edits(plan, vague) if c.kind == "streamed"]
    assert back.score < 1.0 and patch_plan(plan, back.patch).model(Model.TARGET).streamed == ()


def test_the_analytical_model_costs_a_streamed_launch_without_waves():
    """A streamed part: the GEMM family's bytes rate, no wave quantization, and programs_per_sm tile
    slots' share of the bandwidth a program (so half the SMs of an H200 profile draw all of it)."""
    from conjugate.evaluate.analytical import STREAMED, AnalyticalModel, PartCost, part_costs
    from conjugate.evaluate.evaluators import load_profile

    constants = load_profile("analytical").model
    model = AnalyticalModel(constants)
    full = model.part_us(PartCost("gemm", 10**9, 0, 264))  # two full waves' worth of tile programs
    assert model.part_us(PartCost(STREAMED, 10**9, 0, 66)) == pytest.approx(full)
    assert model.part_us(PartCost(STREAMED, 10**9, 0, 132)) == pytest.approx(full)  # no more than all of it
    assert model.part_us(PartCost(STREAMED, 10**9, 0, 33)) == pytest.approx(2 * full)
    assert model.part_us(PartCost("gemm", 10**9, 0, 64)) > 3 * full  # a tile grid of 64: a quarter wave
    schedule = expand(validate_plan(_plan()), TINY)
    graph = build_graph(TINY)
    launch = next(l for l in schedule.launches if isinstance(l.form, Streamed))
    (cost, ) = part_costs(graph, launch, [2])
    assert cost.family == STREAMED and cost.bytes == graph.nodes[launch.ops[0]]["op"].bytes
