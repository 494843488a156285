"""`conjugate calibrate`: the analytical evaluator's constants fitted to measured rounds."""
from __future__ import annotations

import argparse
from pathlib import Path

from rich.text import Text

from conjugate.cli.arguments import evaluator_help
from conjugate.cli.console import out
from conjugate.files import check_output
from conjugate.paths import EXAMPLES_DIR, PLANS_DIR


def cmd_calibrate(args: argparse.Namespace) -> None:
    """Fit the analytical evaluator's constants to measured rounds (a compiler_rounds result file)."""
    import tempfile

    from conjugate.evaluate.calibrate import fit, loss, make_case, measured_rounds, profile_text
    from conjugate.evaluate.evaluators import ProfileError, load_profile
    from conjugate.plan import load_plan
    from conjugate.workload import load_workload

    check_output("--out", args.out, [args.measured])  # over the starting profile: what no --out does
    profile = load_profile(args.evaluator)
    if profile.model is None:
        raise ProfileError(f"--evaluator: profile {profile.name!r} ({profile.source}) is of kind {profile.kind} and "
                           "has no [model] table; calibrate fits an analytical profile's constants")
    source = Path(args.measured)
    rows = measured_rounds(source)
    cases = []
    with tempfile.TemporaryDirectory() as tmp, out.status(Text(f"lowering {len(rows)} measured rounds")):
        for workload, plan, ms in rows:
            cases.append(make_case(load_plan(PLANS_DIR / f"{plan}.json"),
                                   load_workload(EXAMPLES_DIR / f"{workload}.toml"), ms, Path(tmp)))
    before = loss(profile.model, cases)
    with out.status(Text("fitting")):
        fitted = fit(profile.model, cases)
    after = loss(fitted, cases)
    target = Path(args.out) if args.out else Path(profile.source)
    target.write_text(profile_text(fitted, str(source), after, profile.max_check_params))
    out.print(f"fitted {len(cases)} rounds: mean squared log error {before:.4f} -> {after:.4f}; wrote {target}")


def add_command(sub) -> None:
    calibrate = sub.add_parser("calibrate", help="fit the analytical evaluator to measured rounds")
    calibrate.add_argument("--from", dest="measured", required=True,
                           help="a measured-rounds JSON (benchmarks/compiler_rounds.py --json)")
    calibrate.add_argument("--evaluator", default="analytical", help=evaluator_help() + "; the profile to start "
                           "from")
    calibrate.add_argument("--out", help="where to write the fitted profile (default: over the starting one)")
    calibrate.set_defaults(func=cmd_calibrate)
