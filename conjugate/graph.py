"""The op graph of one round: both models' ops as a networkx DAG with bytes and FLOPs per op.

Op ids are `<model>.<step>.<layer>.<kind>`: the draft's `d.s2.l5.gate_up`, the target's single
pass `t.l17.attn`; per-pass ops drop the layer (`d.s0.embed`, `t.lm_head`).
"""
from __future__ import annotations

from dataclasses import dataclass

import networkx as nx

from conjugate.models.spec import ModelSpec
from conjugate.roles import Model
from conjugate.workload import Workload

LAYER_KINDS = ("attn_norm", "qkv", "rope_kv", "attn", "o_proj", "mlp_norm", "gate_up", "down")
PASS_KINDS = ("embed", "final_norm", "lm_head", "argmax")
KINDS = ("embed",) + LAYER_KINDS + ("final_norm", "lm_head", "argmax")
GEMM_KINDS = ("qkv", "o_proj", "gate_up", "down", "lm_head")
LOGIT_BYTES = 4  # logits are fp32


@dataclass(frozen=True)
class Op:
    id: str
    model: Model
    step: int  # draft decode step; 0 for the target's single pass
    layer: int | None
    kind: str
    rows: int  # tokens processed: the GEMM M dimension
    bytes: int  # bytes the op must move through device memory
    flops: int


def op_id(model: Model, step: int, layer: int | None, kind: str) -> str:
    steps = [f"s{step}"] if model == Model.DRAFT else []
    layers = [f"l{layer}"] if layer is not None else []
    return ".".join([model.short, *steps, *layers, kind])


def _cost(spec: ModelSpec, kind: str, rows: int, seen: list[int], elt: int) -> tuple[int, int]:
    """(bytes, flops) of one op over `rows` tokens; `seen[t]` = keys visible to token t."""
    h, f, q, kv, v = spec.hidden_size, spec.ffn_size, spec.q_size, spec.kv_size, spec.vocab_size
    act = rows * elt
    gemm = {"qkv": (h, spec.qkv_size), "o_proj": (q, h), "gate_up": (h, 2 * f), "down": (f, h), "lm_head": (h, v)}
    if kind in gemm:
        k_dim, n_dim = gemm[kind]
        out_cols = {"gate_up": f}.get(kind, n_dim)
        out_bytes = rows * v * LOGIT_BYTES if kind == "lm_head" else act * out_cols
        residual = 2 * act * h if kind in ("o_proj", "down") else 0
        bias = spec.qkv_size * elt if kind == "qkv" and spec.qkv_bias else 0
        return k_dim * n_dim * elt + act * k_dim + out_bytes + residual + bias, 2 * rows * k_dim * n_dim
    if kind == "embed":
        return 2 * act * h, 0
    if kind in ("attn_norm", "mlp_norm", "final_norm"):
        return 2 * act * h + h * elt, 4 * rows * h
    if kind == "rope_kv":
        norms = 2 * spec.head_dim * elt if spec.qk_norm else 0
        return 2 * act * spec.qkv_size + norms, 6 * rows * (q + kv)
    if kind == "attn":
        batch = rows // len(seen)
        keys = batch * max(seen)  # the cache is read once per sequence
        return 2 * keys * kv * elt + 2 * act * q, 4 * batch * sum(seen) * q
    if kind == "argmax":
        return rows * v * LOGIT_BYTES + rows * 8, rows * v
    raise ValueError(f"unknown op kind {kind!r}")


def _model_ops(spec: ModelSpec, model: Model, steps: int, rows: int, tokens: int, context: int, elt: int) -> list[Op]:
    """Ops of one model in execution order; `tokens` new tokens per sequence per pass."""
    ops = []
    for step in range(steps):
        start = context + step
        seen = [start + t + 1 for t in range(tokens)]

        def add(layer: int | None, kind: str) -> None:
            nbytes, flops = _cost(spec, kind, rows, seen, elt)
            ops.append(Op(op_id(model, step, layer, kind), model, step, layer, kind, rows, nbytes, flops))

        add(None, "embed")
        for layer in range(spec.num_layers):
            for kind in LAYER_KINDS:
                add(layer, kind)
        for kind in ("final_norm", "lm_head", "argmax"):
            add(None, kind)
    return ops


def _add_model(graph: nx.DiGraph, ops: list[Op]) -> None:
    for op in ops:
        graph.add_node(op.id, op=op)
    residual = ops[0].id  # the op whose output is the residual stream (first: embed)
    for prev, op in zip(ops, ops[1:]):
        graph.add_edge(prev.id, op.id)  # each op consumes its predecessor's output
        if op.kind == "embed":
            residual = op.id
        if op.kind in ("o_proj", "down"):
            graph.add_edge(residual, op.id)  # residual add
            residual = op.id
        if op.kind == "attn" and op.step > 0:
            for s in range(op.step):  # keys and values written by earlier steps
                graph.add_edge(op_id(op.model, s, op.layer, "rope_kv"), op.id)


def build_graph(workload: Workload) -> nx.DiGraph:
    """Both models' ops for one round. Node attribute `op` holds the Op; graph attribute
    `order` maps each Model to its op ids in execution order."""
    elt = workload.torch_dtype.itemsize
    draft = _model_ops(workload.draft, Model.DRAFT, workload.k, workload.draft_rows, 1, workload.context, elt)
    target = _model_ops(workload.target, Model.TARGET, 1, workload.target_rows, workload.k + 1, workload.context, elt)
    graph = nx.DiGraph(order={Model.DRAFT: [op.id for op in draft], Model.TARGET: [op.id for op in target]})
    _add_model(graph, draft)
    _add_model(graph, target)
    return graph


def graph_totals(graph: nx.DiGraph) -> dict[str, int]:
    ops = [graph.nodes[n]["op"] for n in graph.nodes]
    return {"ops": len(ops), "bytes": sum(o.bytes for o in ops), "flops": sum(o.flops for o in ops)}
