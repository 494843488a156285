"""What a fused-norm GEMM does before its first weight tile, read from its SASS (no GPU: Triton's
compiler and bundled ptxas for sm_90a, as `python -m conjugate.compiler.offline` uses them).

    python lab/fused_norms/sass.py --ops qkv gate_up --rows 5 40 --orders product prologue early [--keep DIR]

Per llama-3.1-8b GEMM (prologue.py's operands and `sequential`'s tile), row count, statistics order
(`product`: conjugate/kernels/gemm.py's, the statistics read in the main loop; `prologue` (the former
product's), `early`: stats_order.py) and variant
(`plain`: x already normalised; `stats_in`: the norm folded in), the kernel's registers, the global
loads it issues before its first weight load (the first LDGSTS: the main loop's asynchronous copy)
and the loops it runs before it (backward branches). Each order compiles in a process of its own
(stats_order.py sets a module constant before anything compiles). `--keep DIR` leaves each kernel's
SASS there. Lab code: nothing in `conjugate/` imports it.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
ORDERS = ("product", "prologue", "early")
_INSTRUCTION = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(.*?);")


def before_first_weight_load(sass: str) -> dict:
    """Global loads (LDG) and backward branches (loops) before the first LDGSTS of the SASS text."""
    loads = loops = 0
    for match in _INSTRUCTION.finditer(sass):
        address, text = int(match.group(1), 16), match.group(2)
        if "LDGSTS" in text:
            return {"loads": loads, "loops": loops}
        if re.search(r"\bLDG\.", text):
            loads += 1
        branch = re.search(r"\bBRA\s+(0x[0-9a-f]+)", text)
        if branch and int(branch.group(1), 16) <= address:
            loops += 1
    return {"loads": loads, "loops": loops, "no_weight_load": True}


def compile_order(order: str, ops: list[str], rows: list[int], keep: Path | None) -> list[dict]:
    """This process's kernels for one statistics order (patches the GEMM module for prologue/early)."""
    os.environ["TRITON_INTERPRET"] = "0"
    sys.path.insert(0, str(HERE))
    import importlib.util
    import tempfile

    spec = importlib.util.spec_from_file_location("lab_prologue", HERE / "prologue.py")
    prologue = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(prologue)
    if order != "product":
        import stats_order

        stats_order.patch(order)
    from conjugate.compiler.cache import KernelCache
    from conjugate.compiler.offline import _Triton
    from conjugate.compiler.round import CompiledLaunch

    tools = _Triton(90)
    out = []
    with tempfile.TemporaryDirectory(prefix="sass-") as tmp:
        for op in ops:
            n = prologue.INTERMEDIATE if op == "gate_up" else prologue.QKV
            tile = prologue.sequential_tiles()[op]
            for m in rows:
                data = prologue.operands(op, m, prologue.HIDDEN, n, "cpu")
                for variant in ("plain", "stats_in"):
                    call, _ = prologue.bind(variant, op, m, data, tile)
                    launch = CompiledLaunch.alone(0, call, KernelCache(Path(tmp)), num_warps=tile.get("num_warps", 4),
                                                  num_stages=tile.get("num_stages", 2))
                    _, (source, options) = tools.bind(launch)
                    compiled = tools.triton.compile(source, target=tools.target, options=options)
                    cubin = Path(tmp) / "kernel.cubin"
                    cubin.write_bytes(compiled.asm["cubin"])
                    sass = subprocess.run([tools.cuobjdump, "-sass", str(cubin)], capture_output=True, text=True,
                                          check=True).stdout
                    usage = subprocess.run([tools.cuobjdump, "--dump-resource-usage", str(cubin)],
                                           capture_output=True, text=True, check=True).stdout
                    if keep:
                        (keep / f"{op}_{m}_{order}_{variant}.sass").write_text(sass)
                    out.append({"op": op, "rows": m, "order": order, "variant": variant, "tile": tile,
                                "registers": int(re.search(r"\bREG:(\d+)", usage).group(1)),
                                **before_first_weight_load(sass)})
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", nargs="+", choices=("qkv", "gate_up"), default=["qkv", "gate_up"])
    parser.add_argument("--rows", nargs="+", type=int, default=[5, 40])
    parser.add_argument("--orders", nargs="+", choices=ORDERS, default=list(ORDERS))
    parser.add_argument("--keep", type=Path, help="a folder for each kernel's SASS")
    parser.add_argument("--one-order", choices=ORDERS, help=argparse.SUPPRESS)  # the child process's order
    args = parser.parse_args()
    if args.keep:
        args.keep.mkdir(parents=True, exist_ok=True)
    common = ["--ops", *args.ops, "--rows", *map(str, args.rows)] + (["--keep", str(args.keep)] if args.keep else [])
    if args.one_order:
        print(json.dumps(compile_order(args.one_order, args.ops, args.rows, args.keep)))
        return 0
    rows = []
    for order in args.orders:
        child = subprocess.run([sys.executable, __file__, "--one-order", order, *common], capture_output=True,
                               text=True, cwd=ROOT, env=os.environ | {"TRITON_INTERPRET": "0"})
        if child.returncode != 0:
            print(f"sass.py: order {order} did not compile: {(child.stderr.strip().splitlines() or ['?'])[-1]}",
                  file=sys.stderr)
            return 1
        rows += json.loads(child.stdout.strip().splitlines()[-1])
    print(f"{'op':8} {'rows':>4} {'order':8} {'variant':9} {'registers':>9} {'loads before':>12} {'loops before':>12}")
    for r in rows:
        print(f"{r['op']:8} {r['rows']:4d} {r['order']:8} {r['variant']:9} {r['registers']:9d} {r['loads']:12d} "
              f"{r['loops']:12d}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
