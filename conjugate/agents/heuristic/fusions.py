"""Fusion edits: vertical fusions per model, on or off.

A fusion whose absorbed op (the one not named after the unit) the ledger lists as losing time ranks
by that loss's share. Where the draft lacks two or more, all of them at once come first: one
evaluation does the work of several, and the fused norms gained (facts: fused_norms). Not for the
target: its norms and RoPE fused into its large GEMMs measured slower in the verify phase (facts:
target_fusions_verify). A fusion measured slower (`measured_slower`) is left out of that edit and
offered alone, ranked low, with the measurement's sentence.
"""
from __future__ import annotations

from conjugate.agents.facts import figure, sentence
from conjugate.agents.heuristic.candidate import Candidate, loss_shares
from conjugate.evaluate.result import KindLoss, LedgerSummary
from conjugate.plan.expand import MAIN_KINDS
from conjugate.plan.schema import FUSIONS, MODEL_KEYS, Plan
from conjugate.roles import Model

NORM_FUSIONS = ("attn_norm+qkv", "mlp_norm+gate_up")  # a layer's norm in a GEMM's prologue
MEASURED_SLOWER = {"gate_up+down": "fused_mlp"}  # fusion -> the fact that measured it slower, either model
TARGET_SLOWER = {f: "target_fusions_verify" for f in ("attn_norm+qkv", "qkv+rope_kv", "mlp_norm+gate_up")}
PER_STEP_FUSIONS = ("final_norm+", "lm_head+")  # run once per decode step, not per layer


def fusion_edits(plan: Plan, ledger: LedgerSummary | None = None) -> list[Candidate]:
    losing = {(model, kind): (share, k) for model, kind, share, k in reversed(loss_shares(ledger))}
    out = []
    for model in MODEL_KEYS:
        on = plan[model]["fusions"]
        together = [f for f in FUSIONS if f not in on and not measured_slower(model, f)]
        if model == Model.DRAFT.value and len(together) > 1:
            lost = [losing[(model, a)] for a in {absorbed(f) for f in together} if (model, a) in losing]
            out.append(_all_fusions(plan, model, together, lost))
        for f in FUSIONS:
            out.append(_one_fusion(model, f, on, losing))
    return out


def _one_fusion(model: str, fusion: str, on: list[str], losing: dict) -> Candidate:
    if fusion in on:
        return Candidate("fusions", [{"op": "remove", "path": f"/{model}/fusions/{on.index(fusion)}"}],
                         f"unfuse {fusion} in the {model}: smaller units pair more easily", 0.25)
    add = [{"op": "add", "path": f"/{model}/fusions/-", "value": fusion}]
    if fact := measured_slower(model, fusion):
        return Candidate("fusions", add, f"fuse {fusion} in the {model}: {sentence(fact)}", 0.2)
    why, score = f"fuse {fusion} in the {model}: one launch fewer each time it runs", 0.4
    if (model, absorbed(fusion)) in losing:
        share, k = losing[(model, absorbed(fusion))]
        why += f" (the ledger: {k.kind} runs {k.loss_ms:.2f} ms over its floor)"
        score += 0.25 * share * launch_part(k)
    return Candidate("fusions", add, why, score)


def measured_slower(model: str, fusion: str) -> str | None:
    """The fact that measured this fusion slower in this model, if one did."""
    return MEASURED_SLOWER.get(fusion) or (TARGET_SLOWER.get(fusion) if model == Model.TARGET.value else None)


def absorbed(fusion: str) -> str:
    """The op whose launches a fusion removes (the one not named after the unit)."""
    return next(k for k in fusion.split("+") if k not in MAIN_KINDS)


def launch_part(k: KindLoss) -> float:
    """The share of a kind's loss that a fusion removing its launches can win back: at most their
    fixed cost each (facts: launch_fixed_ms); of a long GEMM's loss, only its launches' starts."""
    return min(1.0, k.launches * figure("launch_fixed_ms") / k.loss_ms) if k.loss_ms > 0 else 0.0


def _all_fusions(plan: Plan, model: str, missing: list[str], lost: list[tuple[float, KindLoss]]) -> Candidate:
    """Every fusion `missing` in one edit; where it fuses a norm into a model whose launches are
    released at the start of their work (`pdl`), they are released at the end instead (facts:
    pdl_with_norm_fusions)."""
    per_step = [f for f in missing if f.startswith(PER_STEP_FUSIONS)]
    fewer = f"{len(missing) - len(per_step)} launches fewer per layer" + (f" and {len(per_step)} per step" if per_step else "")
    why = f"fuse {', '.join(missing)} in the {model}: {fewer}"
    if lost:
        why += f" (the ledger: their ops run {sum(k.loss_ms for _, k in lost):.2f} ms over their floor)"
    patch = [{"op": "add", "path": f"/{model}/fusions/-", "value": f} for f in missing]
    if plan[model]["pdl"] == "start" and any(f in NORM_FUSIONS for f in missing):
        patch.append({"op": "replace", "path": f"/{model}/pdl", "value": "end"})
        why += f"; its launches released at the end, not the start ({sentence('pdl_with_norm_fusions')})"
    return Candidate("fusions", patch, why, 0.6 + 0.25 * sum(share for share, _ in lost))
