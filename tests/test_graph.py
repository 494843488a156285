"""The op graph: ids, dependencies, bytes and FLOPs."""
from __future__ import annotations

from pathlib import Path

import networkx as nx

from conjugate.graph import KINDS, LAYER_KINDS, build_graph, graph_totals, op_id
from conjugate.roles import Model
from conjugate.workload import load_workload

ROOT = Path(__file__).resolve().parents[1]


def _load(name: str):
    w = load_workload(ROOT / "examples" / f"{name}.toml")
    return w, build_graph(w)


def test_ids_counts_and_order():
    w, g = _load("tiny")
    per_pass = 4 + len(LAYER_KINDS)
    draft, target = g.graph["order"][Model.DRAFT], g.graph["order"][Model.TARGET]
    assert len(draft) == w.k * (w.draft.num_layers * len(LAYER_KINDS) + 4)
    assert len(target) == w.target.num_layers * len(LAYER_KINDS) + 4
    assert draft[:3] == ["d.s0.embed", "d.s0.l0.attn_norm", "d.s0.l0.qkv"]
    assert target[-3:] == ["t.final_norm", "t.lm_head", "t.argmax"]
    assert op_id(Model.DRAFT, 2, 5, "gate_up") == "d.s2.l5.gate_up"
    assert op_id(Model.TARGET, 0, 17, "attn") == "t.l17.attn"
    assert all(g.nodes[n]["op"].model is Model.of_op(n) for n in g.nodes)
    assert {g.nodes[n]["op"].kind for n in g.nodes} == set(KINDS)
    assert per_pass == 12 and nx.is_directed_acyclic_graph(g)


def test_dependencies():
    _, g = _load("tiny")
    assert g.has_edge("d.s0.argmax", "d.s1.embed")  # the next step decodes the token just chosen
    assert g.has_edge("d.s0.l1.rope_kv", "d.s2.l1.attn")  # keys and values written by an earlier step
    assert g.has_edge("t.embed", "t.l0.o_proj") and g.has_edge("t.l0.o_proj", "t.l0.down")  # residual adds
    assert g.has_edge("t.l0.down", "t.l1.o_proj")
    assert not nx.has_path(g, "d.s0.embed", "t.argmax") and not nx.has_path(g, "t.embed", "d.s0.argmax")
    for order in g.graph["order"].values():  # execution order is a topological order of each model
        assert all(nx.has_path(g, a, b) for a, b in zip(order, order[1:]))


def test_gemm_and_attention_costs():
    w, g = _load("llama-1b-8b-b8")
    t = w.target
    qkv = g.nodes["t.l3.qkv"]["op"]
    m = w.target_batch * (w.k + 1)
    assert qkv.rows == m == 40
    assert qkv.flops == 2 * m * t.hidden_size * (t.q_size + 2 * t.kv_size)
    weight_bytes = t.hidden_size * (t.q_size + 2 * t.kv_size) * 2
    assert weight_bytes < qkv.bytes < weight_bytes * 1.05
    d_attn = [g.nodes[f"d.s{s}.l0.attn"]["op"] for s in range(w.k)]
    assert all(a.bytes < b.bytes for a, b in zip(d_attn, d_attn[1:]))  # the draft's context grows each step
    t_attn = g.nodes["t.l0.attn"]["op"]
    kv_read = w.target_batch * (w.context + w.k + 1) * 2 * t.kv_size * 2
    assert kv_read < t_attn.bytes < kv_read * 1.1
    lm = g.nodes["t.lm_head"]["op"]
    assert lm.bytes > t.vocab_size * t.hidden_size * 2 + m * t.vocab_size * 4 - 1


def test_round_bytes_match_the_measured_floor():
    # The H200 floors quoted in DESIGN.md (6.4, 6.0, 4.5 ms) at a copy bandwidth of about 4.3 TB/s.
    for name, floor_ms in (("llama-1b-8b-b8", 6.4), ("llama-1b-8b-b1", 6.0), ("qwen25-05b-7b-b8", 4.5)):
        _, g = _load(name)
        modeled = graph_totals(g)["bytes"] / 4.3e12 * 1e3
        assert abs(modeled - floor_ms) / floor_ms < 0.05, (name, modeled)
