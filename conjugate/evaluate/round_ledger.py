"""A plan's round on this GPU, recorded kernel by kernel into its time ledger (ledger.py)."""
from __future__ import annotations

from conjugate.errors import ConjugateError


def measure_ledger(plan, workload, replays: int):
    """The plan's round on this GPU: compiled, checked against the reference (a wrong round is not
    profiled), captured in its CUDA graph, its kernels recorded over `replays` replays; a step launch's
    time divided among its ops by its in-kernel critical path (whole, as one kind, if that stamped run fails)."""
    import torch

    from conjugate.compiler.round import compile_round
    from conjugate.evaluate.correctness import ReferenceChecker, tolerance_for
    from conjugate.evaluate.ledger import Ledger, kernel_records, step_shares
    from conjugate.evaluate.evaluators import load_profile
    from conjugate.evaluate.rounds import checked_run, round_inputs
    from conjugate.evaluate.timing import copy_bandwidth_gbs
    from conjugate.graph import build_graph
    from conjugate.roles import Model

    device = torch.device("cuda")
    draft, target = workload.weights(Model.DRAFT, device), workload.weights(Model.TARGET, device)
    inputs = round_inputs(workload, draft, target)
    tolerances = load_profile("h200").tolerances  # the measured evaluator's: a round it would accept
    check = ReferenceChecker(draft, target, inputs, workload.dtype, tolerance_for(workload.dtype, tolerances))
    compiled = compile_round(plan, workload, draft, target)
    compiled.load(inputs)
    compiled.warmup()
    report = checked_run(compiled, inputs, check)
    if report.ok:
        compiled.capture()
        report = checked_run(compiled, inputs, check, graph=True)
    if not report.ok:
        raise ConjugateError(f"plan {plan.name!r} computes a wrong round on {workload.name}: "
                             + "; ".join(report.problems[:3]))
    compiled.load(round_inputs(workload, draft, target, workload.seed + 1))
    records = kernel_records(compiled.run, device, replays)
    try:
        inside = step_shares(compiled)
    except Exception:  # noqa: BLE001  the step launch's stamped run (its own compile): the ledger keeps it whole
        inside = None
    return Ledger.of(compiled, build_graph(workload), records, copy_bandwidth_gbs(device), inside=inside)
