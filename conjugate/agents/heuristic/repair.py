"""Repairs of a failed node: undo the likely cause. Smaller tiles or fewer stages for the parts a
compile failure blames when resources ran out; separate operands, no draft work in the failing
shared launch, fewer split partial sums where the round was wrong, crashed or hung; an override the
schedule refused removed; sequential alignment where a dependency broke. Each repair is filed under
the knob family it edits."""
from __future__ import annotations

import re

from conjugate.agents.heuristic.candidate import Candidate, failed_parts
from conjugate.agents.heuristic.cross import unpair_override
from conjugate.agents.heuristic.tiles import scaled, set_tile, shrink
from conjugate.compiler.feedback import PartRef
from conjugate.evaluate.result import EvalResult, Status
from conjugate.plan.expand import STEP
from conjugate.plan.schema import Plan
from conjugate.plan.tiles import FAMILY_OF
from conjugate.roles import Model

_OVERRIDE_PATH = re.compile(r"^\$\.cross\.overrides\[(\d+)\]")  # a plan error's path naming an override


def repair_edits(plan: Plan, result: EvalResult) -> list[Candidate]:
    """A failed node: undo the likely cause, the parts the compile failure blames first."""
    text, (parts, head), out = _failure_text(result), failed_parts(result), []
    if plan[Model.DRAFT.value]["form"] == STEP:  # blamed, or the newest and largest launch of the round
        blamed = any(p.kind == STEP for p in parts)
        out.append(Candidate("form", [{"op": "replace", "path": f"/{Model.DRAFT.value}/form", "value": "launches"}],
                             f"{result.status} with the draft's step launch: its steps as launches again",
                             1.0 if blamed else 0.6))
        parts = tuple(p for p in parts if p.kind != STEP)
        head = head if head is None or head.kind != STEP else None
    for model in Model:  # a failure with streamed residual GEMMs: the blamed kind, or all, by the tile kernel
        streamed = list(plan[model.value].get("streamed", []))
        blamed = sorted({p.kind for p in parts if p.model == model and p.kind in streamed})
        if streamed and (blamed or "streamed kernel" in text):
            keep = [k for k in streamed if k not in blamed] if blamed else []
            out.append(Candidate("streamed", [{"op": "replace", "path": f"/{model.value}/streamed", "value": keep}],
                                 f"{result.status} with the {model.value}'s streamed {' and '.join(blamed or streamed)}: "
                                 "by the tile kernel again", 1.0 if blamed else 0.6))
            parts = tuple(p for p in parts if not (p.model == model and p.kind in blamed))
    if "shared memory" in text or "out of resource" in text or "outofresources" in text:
        for p in parts:
            out += shrink(plan, p, head or p, 1.0, f"{p.op} does not fit the GPU's resources")
    if result.status in (Status.INCORRECT, Status.CRASHED, Status.TIMEOUT) or "packed" in text:
        out += _undo_colocation(plan, parts, result.status)
    for n in sorted({int(m.group(1)) for e in result.plan_errors if (m := _OVERRIDE_PATH.match(e))}, reverse=True):
        if n < len(plan["cross"]["overrides"]):
            out.append(Candidate("cross", [{"op": "remove", "path": f"/cross/overrides/{n}"}],
                                 f"override {n} breaks the schedule ({result.status}): remove it", 0.98))
    if "dependency" in text and plan["cross"]["alignment"] != "sequential":
        out.append(Candidate("cross", [{"op": "replace", "path": "/cross/alignment", "value": "sequential"}],
                             "the schedule breaks a dependency: fall back to sequential alignment", 0.9))
    if not out:
        for p in parts:
            out += shrink(plan, p, head or p, 0.85, f"{result.status} at {p.op}")
    return out


def _failure_text(result: EvalResult) -> str:
    """What the failure says in words (lower case): its error, plan errors and compile failure's reason."""
    reason = result.compile_failure.reason if result.compile_failure else ""
    return " ".join((result.error, *result.plan_errors, reason)).lower()


def _undo_colocation(plan: Plan, parts: tuple[PartRef, ...], status: Status) -> list[Candidate]:
    out = []
    if plan["cross"]["operand_layout"] == "packed":
        out.append(Candidate("cross", [{"op": "replace", "path": "/cross/operand_layout", "value": "separate"}],
                             f"{status} with packed operands: go back to separate weight buffers", 0.97))
    for t in [p for p in parts if p.model is Model.TARGET][:1]:
        if any(p.model is Model.DRAFT for p in parts):
            out.append(Candidate("cross", unpair_override(t.op),
                                 f"{status} in the shared launch of {t.op}: keep draft work out of it", 0.95))
    for p in parts:
        key = {"gemm": "SPLIT_K", "attn": "SPLIT_KV"}.get(FAMILY_OF.get(p.kind, ""))
        new = scaled(plan, p.model, p.kind, key, 0.5) if key else None
        if new is not None:
            out.append(Candidate("tiles", set_tile(plan, p.model, p.kind, key, new),
                                 f"{status} around {p.op}: fewer split partial sums ({key} -> {new})", 0.9))
    return out

