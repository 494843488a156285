"""`python -m conjugate.compiler.offline`: a plan's kernels compiled for sm_90 by Triton's bundled ptxas,
without a GPU, each launch's registers, spills and shared memory reported."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import conjugate  # noqa: F401  (selects the interpreter before triton is imported)
import triton

ROOT = Path(__file__).resolve().parents[1]
PTXAS = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"
pytestmark = pytest.mark.skipif(not PTXAS.exists(), reason="this Triton bundles no ptxas")

GEMM = {"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 64, "SPLIT_K": 2}  # split-K everywhere it is set
TILES = {m: {"qkv": GEMM, "o_proj": GEMM, "down": GEMM, "attn": {"BLOCK_N": 16, "SPLIT_KV": 2}}
         for m in ("draft", "target")}
DRAFT_FUSIONS = ["attn_norm+qkv", "mlp_norm+gate_up", "lm_head+argmax"]  # draft head_dim 16: no rope_kv on a GPU


def _plan(tmp_path: Path, target_fusions: list[str]) -> Path:
    plan = {"schema": "conjugate.plan/1", "name": "offline", "alignment": "proportional", "tiles": TILES,
            "fusions": {"draft": DRAFT_FUSIONS, "target": target_fusions},
            "pairs": {"qkv": ["*"], "attn": ["o_proj"]}, "launch": {"num_warps": 4, "num_stages": 2}}
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan))
    return path


@pytest.fixture(scope="module")
def triton_cache(tmp_path_factory) -> Path:
    """A fresh Triton cache for this module: the kernels are really compiled, once."""
    return tmp_path_factory.mktemp("triton-cache")


def _offline(plan: Path, cache: Path, *extra: str) -> subprocess.CompletedProcess:
    env = os.environ | {"TRITON_INTERPRET": "0", "TRITON_CACHE_DIR": str(cache)}
    return subprocess.run([sys.executable, "-m", "conjugate.compiler.offline", str(plan), "--workload",
                           str(ROOT / "examples" / "tiny.toml"), *extra], capture_output=True, text=True, env=env,
                          cwd=ROOT, timeout=300)


def _rows(stdout: str) -> dict[str, tuple[int, int, int]]:
    """The table's rows: ops -> (registers, spills, shared bytes)."""
    rows = [line.split() for line in stdout.splitlines() if line.split() and line.split()[0].isdigit()]
    return {" ".join(r[1:-3]): (int(r[-3]), int(r[-2]), int(r[-1])) for r in rows}


@pytest.mark.parametrize("target_fusions", [
    ["attn_norm+qkv", "mlp_norm+gate_up", "lm_head+argmax"],
    ["qkv+rope_kv", "mlp_norm+gate_up", "lm_head+argmax"],  # target head_dim 32: half-heads of 16
    ["attn_norm+qkv", "mlp_norm+gate_up", "gate_up+down", "lm_head+argmax"],  # the MLP as one launch
], ids=["norm-prologues", "qkv+rope_kv", "fused-mlp"])
def test_every_launch_compiles_for_hopper(tmp_path, triton_cache, target_fusions):
    proc = _offline(_plan(tmp_path, target_fusions), triton_cache)
    assert proc.returncode == 0, proc.stderr
    header = proc.stdout.splitlines()[0]
    assert header.startswith("offline on tiny: ") and header.endswith("compiled for sm_90")
    assert proc.stdout.splitlines()[1].split() == ["launch", "ops", "regs", "spills", "shared"]
    rows = _rows(proc.stdout)
    assert len(rows) == int(header.split(": ")[1].split()[0])  # one row a launch
    assert all(regs > 0 and spills >= 0 and shared >= 0 for regs, spills, shared in rows.values())
    ops = " ".join(rows)
    mlp = "t.l0.mlp_norm+t.l0.gate_up" + ("+t.l0.down" if "gate_up+down" in target_fusions else "")
    wanted = ["d.s0.l0.attn_norm+d.s0.l0.qkv", mlp, "t.lm_head+t.argmax", "t.l0.attn"]
    wanted.append("t.l0.qkv+t.l0.rope_kv" if "qkv+rope_kv" in target_fusions else "t.l0.attn_norm+t.l0.qkv")
    assert all(w in ops for w in wanted), ops
    assert any(" | " in label for label in rows)  # a launch shared by the two models
    assert any(shared > 0 for _, _, shared in rows.values())


def test_an_unknown_arch_is_one_line_error(tmp_path, triton_cache):
    proc = _offline(_plan(tmp_path, ["lm_head+argmax"]), triton_cache, "--arch", "12")
    assert proc.returncode != 0 and not proc.stdout
    assert len(proc.stderr.strip().splitlines()) == 1 and proc.stderr.startswith("error: arch 12:"), proc.stderr


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="this process is not in interpreter mode")
def test_refuses_a_process_already_interpreting(tmp_path, capsys):
    from conjugate.compiler.offline import main

    assert main([str(_plan(tmp_path, [])), "--workload", str(ROOT / "examples" / "tiny.toml")]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "interpreter mode" in err


def test_programmatic_dependent_launches_compile_for_hopper_with_the_wait_in_every_kernel(tmp_path):
    """Every launch of both models waits for the kernel before it (griddepcontrol.wait in each
    kernel's PTX: the interpreter never runs it), the draft's releasing the next at the end, the shared
    launches' too. The draft's residual GEMMs sum their splits
    atomically and still write the row statistics its fused norms read (the last split's read-back)."""
    plan = json.loads(_plan(tmp_path, ["mlp_norm+gate_up", "lm_head+argmax"]).read_text())
    plan["pdl"] = {"draft": {"trigger": "end"}, "target": {"trigger": "start"}}
    plan["split_reduce"] = {"draft": "atomic"}
    path = tmp_path / "pdl.json"
    path.write_text(json.dumps(plan))
    cache = tmp_path / "triton-cache"  # this plan's kernels alone
    proc = _offline(path, cache)
    assert proc.returncode == 0, proc.stderr
    ptx = [p.read_text() for p in cache.rglob("*.ptx")]
    assert len(ptx) >= 10 and all("griddepcontrol.wait" in text for text in ptx)
    assert all("griddepcontrol.launch_dependents" in text for text in ptx)


STEP_COMPILE = """
import sys
from types import SimpleNamespace
from conjugate.compiler.step.launch import StepLaunch
from conjugate.compiler.step.layout import tile_weights
from conjugate.compiler.step.table import build, step_table
from conjugate.compiler.buffers import ModelBuffers, PreparedWeights
from conjugate.compiler.offline import _Triton
from conjugate.compiler.step.compiled import CompiledStep
from conjugate.models.presets import from_name
from conjugate.models.weights import meta_weights
from conjugate.roles import Model
import torch

tools = _Triton(90)
for name in sys.argv[1:]:
    if name.startswith("verify:"):  # a target's verify pass: 8 sequences of 6 tokens (a 64-row tile, K
        spec = from_name(name.split(":")[1])  # staged 16 tiles at a time), their logits kept
        prog = step_table(spec, 8, 1, 132, sms=132, tokens=6)
        kv = torch.empty(2, spec.num_layers, 8, spec.num_kv_heads, 1100, spec.head_dim, dtype=torch.bfloat16,
                         device="meta")
        launch = StepLaunch(prog, tile_weights(meta_weights(spec, torch.bfloat16), prog), kv, logits=True)
        step = SimpleNamespace(launch=launch, digest=name)
    elif name.startswith("tile_waits:"):  # a table of per-tile waits: epilogue inputs load after the finish waits
        spec = from_name(name.split(":")[1])
        prog = build(spec, 16, 2, 132)
        kv = torch.empty(2, spec.num_layers, 16, spec.num_kv_heads, 1100, spec.head_dim, dtype=torch.bfloat16,
                         device="meta")
        step = SimpleNamespace(launch=StepLaunch(prog, tile_weights(meta_weights(spec, torch.bfloat16), prog), kv),
                               digest=name)
    else:  # the examples' largest step batch (or b32:MODEL, the compiler's largest), 2 steps, a 1k context
        batch, model = (32, name[4:]) if name.startswith("b32:") else (16, name.split(":")[-1])  # sums:MODEL
        bufs = ModelBuffers.allocate(PreparedWeights(meta_weights(from_name(model), torch.bfloat16)), batch, 1, 2,
                                     1100, Model.DRAFT)
        step = CompiledStep.build(0, bufs, 132, "main")
        if name.startswith("sums:"):  # every epilogue through the fp32 sums, as on a table of per-tile waits
            step.use_launch_options(direct_epilogue=False)
        if name.startswith("plain:"):  # attention's history read by the compute warpgroup, not the ring
            step.use_launch_options(ring_kv=False)
    key, (source, options) = tools.bind_step(step)
    r = tools.compile(source, options)
    kw = step.launch.kwargs
    print(name, r.registers, r.spills, r.shared_bytes, kw["KV_BUFS"], kw["RPAD"], kw["CHUNK"],
          int(kw["DIRECT_EPILOGUE"]), int(kw["RING_KV"]), int(kw["COARSE"]))
"""


def test_the_step_kernel_compiles_for_hopper_for_every_family(triton_cache):
    """The step form's Gluon kernel, bound to each family's draft shapes (llama: RoPE scaling, qwen2:
    bias, qwen3: q/k norm and 128-dim heads; qwen3 also at 32 sequences, a 32-row tile; qwen2 also with
    every epilogue through the sums, as a table of per-tile waits runs it; attention's history through
    the loader's ring by default, and qwen3 also with it read after the waits; qwen2 also on a table of
    per-tile waits, whose epilogues load their inputs after the finish waits) on meta buffers: compiled for
    sm_90a within a program's registers (168), with no local memory (cuobjdump's count; Triton's own
    spill count on a GPU read 8 for the same kernels) and within Hopper's shared memory."""
    env = os.environ | {"TRITON_INTERPRET": "0", "TRITON_CACHE_DIR": str(triton_cache)}
    names = ["llama-3.2-1b", "qwen2.5-0.5b", "qwen3-0.6b", "b32:qwen3-0.6b", "verify:qwen3-8b", "sums:qwen2.5-0.5b",
             "plain:qwen3-0.6b", "tile_waits:qwen2.5-0.5b"]
    proc = subprocess.run([sys.executable, "-c", STEP_COMPILE, *names],
                          capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = [line.split() for line in proc.stdout.splitlines()]
    assert [r[0] for r in rows] == names
    for name, regs, spills, shared, kv_buffers, rpad, chunk, direct, ring_kv, coarse in rows:
        assert int(regs) <= 168 and int(spills) == 0 and 200_000 < int(shared) <= 232_448, (name, regs, shared)
        assert int(kv_buffers) == 2  # attention's default depth, the activation tiles grown where needed
        per_tile = name.startswith("tile_waits:")
        assert coarse == ("0" if per_tile else "1")  # epilogue inputs loaded early on coarse tables only
        assert direct == ("0" if name.startswith(("sums:", "tile_waits:")) else "1")  # the default on coarse tables
        assert ring_kv == ("0" if name.startswith("plain:") else "1")  # 64- and 128-dim heads: the ring
    # row tiles; whole K or staged
    assert [(r[5], r[6]) for r in rows] == [("16", "0")] * 3 + [("32", "0"), ("64", "16")] + [("16", "0")] * 3
