"""Is a compiled round the reference round? Tokens, logits and KV caches, within the dtype's tolerance.

Tokens must match the fp32 reference exactly, except at a near tie: where the compiled token's
reference logit is within `tie_margin` (relative to the logits' spread) of the best one, rounding
in bf16 may legitimately pick it. `check_round` teacher-forces the reference draft with the
compiled round's own tokens, so after such a tie every later step is still compared like for like.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from conjugate.models.reference import RoundInputs, RoundOutputs, reference_round


@dataclass(frozen=True)
class Tolerance:
    rel: float  # ||got - ref|| / ||ref|| for logits and written cache entries
    tie_margin: float  # fraction of the logits' standard deviation


# The reference is fp32 throughout; a compiled round rounds GEMM operands to the weight type in
# every layer, and the relative error compounds with depth: 1.4% (16 layers) to 2.1% (32 layers)
# on the KV caches of the bf16 Llama pair on the H200. A wrong head, layer or position is far above.
# Near ties: bf16 operands move each logit by a few percent of the logits' spread, enough to swap
# the two best of 128k tokens when they lie within about a fifth of a standard deviation.
TOLERANCES = {"fp32": Tolerance(1e-4, 1e-4), "fp16": Tolerance(1e-2, 0.1), "bf16": Tolerance(5e-2, 0.2)}
# a reference round whose logits are not finite: its weights are damaged, not the compiled round
REFERENCE_DAMAGED = "the reference {model} logits hold NaN or infinity"


@dataclass
class CheckReport:
    ok: bool
    problems: list[str] = field(default_factory=list)
    near_ties: int = 0
    errors: dict[str, float] = field(default_factory=dict)  # name -> relative error

    def to_dict(self) -> dict:
        return {"ok": self.ok, "problems": self.problems, "near_ties": self.near_ties, "errors": self.errors}


def _rel(got: torch.Tensor, ref: torch.Tensor) -> float:
    """||got - ref|| / ||ref|| in float64, on got's device (inf if got holds a NaN or an infinity)."""
    got, ref = got.double(), ref.to(got.device).double()
    if not torch.isfinite(got).all():
        return float("inf")
    return float((got - ref).norm() / ref.norm().clamp_min(1e-30))


def _group_rel(got: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """_rel of every (layer, entry) group of caches' new entries [layers, kv_heads, entries, head_dim],
    all at once on their device: a [layers, entries] tensor on the CPU."""
    got, ref = got.double(), ref.double()
    num = (got - ref).pow(2).sum(dim=(1, 3)).sqrt()
    rel = num / ref.pow(2).sum(dim=(1, 3)).sqrt().clamp_min(1e-30)
    return rel.masked_fill(~torch.isfinite(got).all(dim=3).all(dim=1), float("inf")).cpu()


def _token_ok(got: int, ref_logits: torch.Tensor, margin: float) -> bool:
    """Exact, or a near tie of the reference's best logit."""
    return bool(ref_logits[got] >= ref_logits.max() - margin * ref_logits.std())


def _check_target(ref: RoundOutputs, got: RoundOutputs, tol: Tolerance, report: CheckReport) -> None:
    ref_tokens, got_tokens = ref.target_tokens.cpu(), got.target_tokens.cpu()
    ref_logits = ref.target_logits
    for b, t in (ref_tokens != got_tokens).nonzero().tolist():
        if 0 <= got_tokens[b, t] < ref_logits.shape[-1] and _token_ok(int(got_tokens[b, t]), ref_logits[b, t].cpu(),
                                                                      tol.tie_margin):
            report.near_ties += 1
        else:
            report.problems.append(f"target token [{b}, {t}]: {int(got_tokens[b, t])}, reference {int(ref_tokens[b, t])}")
    if got.target_logits is not None:
        report.errors["target_logits"] = _rel(got.target_logits, ref_logits)


def _check_draft_tokens(ref: RoundOutputs, got: RoundOutputs, tol: Tolerance, report: CheckReport) -> None:
    ref_tokens, got_tokens = ref.draft_tokens.cpu(), got.draft_tokens.cpu()
    for b, s in (ref_tokens != got_tokens).nonzero().tolist():
        g = int(got_tokens[b, s])
        if 0 <= g < ref.draft_logits.shape[-1] and _token_ok(g, ref.draft_logits[b, s].cpu(), tol.tie_margin):
            report.near_ties += 1
        else:
            report.problems.append(f"draft token [{b}, {s}]: {g}, reference {int(ref_tokens[b, s])}")


def _check_cache(name: str, ref, got, lengths: list[int], written: int, tol: Tolerance, report: CheckReport) -> None:
    """Caches [layers, B, kv_heads, positions, head_dim]: sequence b's first lengths[b] positions
    unchanged, the `written` after them within tolerance. Compared where the round's cache is (a
    whole 8B target's cache is a gigabyte: it is not copied to the CPU)."""
    for part in ("k", "v"):
        g = getattr(got, part)
        r = getattr(ref, part).to(g.device)
        if any(not torch.equal(r[:, b, :, :n], g[:, b, :, :n]) for b, n in enumerate(lengths)):
            report.problems.append(f"{name} cache {part}: positions before the context were changed")
        new_ref = torch.cat([r[:, b, :, n:n + written] for b, n in enumerate(lengths)], dim=2)
        new_got = torch.cat([g[:, b, :, n:n + written] for b, n in enumerate(lengths)], dim=2)
        report.errors[f"{name}_cache_{part}"] = err = _rel(new_got, new_ref)
        # Each (layer, position) on its own too, at twice the tolerance: one wrong vector among
        # thousands barely moves the whole-cache error but stands out in its own group.
        groups = _group_rel(new_got, new_ref)
        if groups.numel() == 0:
            report.errors[f"{name}_cache_{part}_worst_group"] = 0.0
            continue
        entries = groups.shape[1]
        worst = [divmod(int(i), entries) for i in groups.flatten().argsort(descending=True, stable=True)[:3]]
        report.errors[f"{name}_cache_{part}_worst_group"] = worst_error = float(groups[worst[0]])
        if not err <= tol.rel or not worst_error <= 2 * tol.rel:
            report.problems.append(f"{name} cache {part}: worst (layer, new entry) " +
                                   ", ".join(f"{g} ({float(groups[g]):.1e})" for g in worst))


def tolerance_for(dtype: str, overrides: dict[str, dict[str, float]] | None = None) -> Tolerance:
    """The dtype's tolerance, or an evaluator profile's override of it."""
    given = (overrides or {}).get(dtype)
    return Tolerance(given["rel"], given["tie_margin"]) if given else TOLERANCES[dtype]


def compare_rounds(ref: RoundOutputs, got: RoundOutputs, dtype: str, lengths: int | tuple[torch.Tensor, torch.Tensor],
                   tol: Tolerance | None = None) -> CheckReport:
    """Compare a compiled round with a reference round of the same inputs (teacher-forced where the
    draft took a near tie: see check_round). `lengths`: the sequences' lengths before the round, one
    for all, or (draft lengths [Bd], target lengths [Bt]) as RoundInputs holds them."""
    tol = tol or TOLERANCES[dtype]
    report = CheckReport(ok=True)
    for name, logits in (("draft", ref.draft_logits), ("target", ref.target_logits)):
        if not bool(torch.isfinite(logits).all()):  # argmax of NaN is token 0 in both: tokens would agree
            report.problems.append(REFERENCE_DAMAGED.format(model=name) + f": the {name} model's weights are "
                                   "damaged, so its tokens prove nothing")
    _check_target(ref, got, tol, report)
    _check_draft_tokens(ref, got, tol, report)
    if got.draft_logits is not None:
        report.errors["draft_logits"] = _rel(got.draft_logits, ref.draft_logits)
    draft_lengths, target_lengths = (lengths, lengths) if isinstance(lengths, int) else lengths
    _check_cache("draft", ref.draft_cache, got.draft_cache, _listed(draft_lengths, ref.draft_tokens.shape[0]),
                 ref.draft_tokens.shape[1], tol, report)
    _check_cache("target", ref.target_cache, got.target_cache, _listed(target_lengths, ref.target_tokens.shape[0]),
                 ref.target_tokens.shape[1], tol, report)
    for name, err in report.errors.items():
        if not name.endswith("_worst_group") and not err <= tol.rel:
            report.problems.append(f"{name}: relative error {err:.2e} over the {dtype} tolerance {tol.rel:.0e}")
    report.ok = not report.problems
    return report


def _listed(lengths: int | torch.Tensor, batch: int) -> list[int]:
    return [lengths] * batch if isinstance(lengths, int) else [int(n) for n in lengths.tolist()]


def _lengths(inputs: RoundInputs) -> tuple[torch.Tensor, torch.Tensor]:
    return inputs.draft_lengths, inputs.target_lengths


def check_round(draft, target, inputs: RoundInputs, got: RoundOutputs, dtype: str,
                tol: Tolerance | None = None) -> CheckReport:
    """The reference round teacher-forced by the compiled round's draft tokens, compared with it."""
    forced = got.draft_tokens.to(inputs.draft_last_tokens.device)
    return compare_rounds(reference_round(draft, target, inputs, forced), got, dtype, _lengths(inputs), tol)


class ReferenceChecker:
    """check_round for many rounds of the same inputs: the reference of a draft-token sequence is
    computed once (on a GPU the fp32 reference of an 8B target takes seconds)."""

    def __init__(self, draft, target, inputs: RoundInputs, dtype: str, tol: Tolerance | None = None):
        self.draft, self.target, self.inputs, self.dtype, self.tol = draft, target, inputs, dtype, tol
        self._refs: dict[bytes, RoundOutputs] = {}

    def __call__(self, got: RoundOutputs) -> CheckReport:
        forced = got.draft_tokens.to(self.inputs.draft_last_tokens.device)
        key = forced.cpu().numpy().tobytes()
        if key not in self._refs:
            if len(self._refs) >= 2:  # a reference holds fp32 KV caches: keep few
                self._refs.pop(next(iter(self._refs)))
            self._refs[key] = reference_round(self.draft, self.target, self.inputs, forced)
        return compare_rounds(self._refs[key], got, self.dtype, _lengths(self.inputs), self.tol)
