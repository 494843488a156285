"""Can Gluon, in the Triton 3.6 this project pins, reduce a split tile's pieces across the CTAs of a
cluster (through distributed shared memory) instead of through L2? Four kernels compiled for sm_90a
on the CPU (no GPU needed), each in a process of its own, since a failing lowering may abort:

    cluster    num_ctas=2 with a CTA-replicated layout, the rank read and a cluster barrier by inline PTX
    reduce     gl.sum over an axis whose rows live on different CTAs of the cluster
    exchange   gl.convert_layout from a CTA-split layout to a CTA-replicated one (the DSMEM exchange)
    single     the exchange's kernel at num_ctas=1 (the control: the same code compiles without a cluster)

    python lab/cluster_reduce/probe.py [--json OUT.json]

Lab code: nothing in conjugate/ imports it.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

def probe(case: str) -> dict:
    env = os.environ | {"TRITON_INTERPRET": "0", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, str(Path(__file__).with_name("kernels.py")), case], capture_output=True,
                          text=True, env=env, cwd=ROOT, timeout=300)
    said = (proc.stdout + proc.stderr).splitlines()
    if proc.returncode == 0:
        return {"case": case, "compiles": True, "ptx": next((l[5:] for l in said if l.startswith("PTX: ")), "")}
    why = next((l.strip() for l in said if "Assertion" in l or " error: " in l), said[-1] if said else "")
    return {"case": case, "compiles": False, "error": why.replace(f"{ROOT}/", "")[:400]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    rows = [probe(case) for case in ("cluster", "reduce", "exchange", "single")]
    for r in rows:
        print(f"{r['case']:<9} " + (f"compiles ({r['ptx']})" if r["compiles"] else f"fails: {r['error']}"))
    if args.json:
        import triton
        args.json.write_text(json.dumps({"command": "python " + " ".join(sys.argv), "triton": triton.__version__,
                                         "arch": "sm_90a", "probes": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
