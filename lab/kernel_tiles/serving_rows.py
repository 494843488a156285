"""What the H100's serving-size sweep says by row count, from committed sweeps (no GPU).

    python lab/kernel_tiles/serving_rows.py benchmarks/results/serving_reads_h100.json \
        --also benchmarks/results/attention_reads_h100.json      # tables 1 and 2 (benchmarks/README.md)
    python lab/kernel_tiles/serving_rows.py benchmarks/results/serving_sweep_h100.json \
        --also benchmarks/results/kernel_sweep_b32_h100.json     # table 3 (commit a55a300)
    python lab/kernel_tiles/serving_rows.py benchmarks/results/compute_sweep_h100.json \
        --against benchmarks/results/serving_reads_h100.json     # table 4

1. Per model and band of rows, the medians of the share of copy bandwidth that the shipped tile, the
   best tile and a launch only reading the same bytes (`--read`) reached, how many best tiles reach
   #49's 85%, and the best tile over the shipped one (geometric mean): benchmarks/README.md's table
   (the tiny CPU example's shapes left out); with `--cublas`, cuBLAS's median share and the best tile's
   time over cuBLAS's (geometric mean). Where the sweep recorded the dense bf16 rate
   (`matmul_tflops`), also the best tile's share of the roofline floor: the larger of the weight bytes
   at the copy rate and the FLOPs (rows x weight bytes: two a weight element a row) at that rate.
2. Where the sweep timed read launches (kernel_sweep.py --read): their median share of copy by size
   (this sweep's and `--also`'s shapes), and a line through the GEMMs' reads: a launch's fixed time
   and the rate it streams at.
3. For the GEMMs that multiply more rows than the shipped tile's row block (BLOCK_M), with the
   `--also` sweeps: the best tile with BLOCK_M at the rows (a power of two, at most 64) over the best
   at the shipped BLOCK_M, and the candidates closest to raising BLOCK_M alone (the shipped tile's
   other keys kept; and with BLOCK_N cut by the same factor, keeping the program count) over the
   shipped tile. Why no one-key BLOCK_M move entered the heuristic (commit a55a300).
4. `--against SWEEP.json`: this sweep's best tiles against that one's on the shapes both timed beside
   cuBLAS (--cublas): each best over its own process's cuBLAS, cuBLAS across the two, and the two
   bests across them (benchmarks/README.md's tall tiles past 128 rows).
5. `--bound GBS` (another GPU's copy rate, e.g. the H200's 4253 from kernel_sweep_target_h200.json):
   the shapes whose bytes at #49's share of that rate (85% for GEMMs, 80% for attention) would take
   less time than the fastest launch timed alone in these sweeps (the tiny CPU example's reads of a few
   kilobytes included), whatever it did: no launch alone can
   meet the aim there unless that GPU starts, reads and ends a launch faster. Beside it, by kind and
   model, the shapes whose read launch alone stayed under the aim on this GPU (measured).
Lab code: nothing in `conjugate/` imports it.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

BANDS = (("draft", 1, 128), ("target", 1, 128), ("target", 129, 1 << 20))
GEMMS = ("qkv", "o_proj", "gate_up", "down")
SCHEDULE_KEYS = ("num_warps", "num_stages")  # launch settings, not the tile's shape


def rows_of(shape: dict) -> int:
    return int(shape["shape"].split()[1].split("x")[0])


def cpu_only(shape: dict) -> bool:
    """A shape only the tiny CPU example has (kilobytes: no bandwidth to speak of)."""
    return all(w.split()[0] == "tiny" for w in shape.get("workloads", ["?"]))


def roofline_us(shape: dict, copy_gbs: float, tflops: float) -> float:
    """The shape's floor in us: its weight bytes streamed at the copy rate, or its FLOPs at the dense
    rate where the rows put it past the ridge (peak / copy rows: 263 on the H100, about 188 on the H200)."""
    return max(shape["bytes"] / (copy_gbs * 1e3), rows_of(shape) * shape["bytes"] / (tflops * 1e6))


def timed(shape: dict, what: str) -> bool:
    return "us" in (shape.get(what) or {})


def bands(shapes: list[dict], copy_gbs: float | None = None, tflops: float | None = None) -> list[dict]:
    """Table 1: one row per (model, band) with shapes in it. A shape whose read launch could not be
    timed beside the L2 flush is left out (its tiles' times are that flush's noise, as --tabulate
    says); the read and cuBLAS medians are over the shapes that have them (None where none has), the
    roofline share where both rates are given."""
    out = []
    for model, low, high in BANDS:
        got = [s for s in shapes if s["model"] == model and s["kind"] in GEMMS and low <= rows_of(s) <= high
               and s.get("best") and timed(s, "shipped") and "error" not in (s.get("read") or {}) and not cpu_only(s)]
        if not got:
            continue
        read = [s["read"]["share_of_copy"] for s in got if timed(s, "read")]
        cublas = [s for s in got if timed(s, "cublas")]  # --cublas: the library on the same bytes
        out.append({"model": model, "rows": f"{min(map(rows_of, got))}-{max(map(rows_of, got))}", "shapes": len(got),
                    "shipped": statistics.median(s["shipped"]["share_of_copy"] for s in got),
                    "best": statistics.median(s["best"]["share_of_copy"] for s in got),
                    "at_85": sum(s["best"]["share_of_copy"] >= 0.85 for s in got),
                    "read": statistics.median(read) if read else None,
                    "gain": statistics.geometric_mean(s["shipped"]["us"] / s["best"]["us"] for s in got),
                    "cublas_shapes": len(cublas),
                    "cublas": statistics.median(s["cublas"]["share_of_copy"] for s in cublas) if cublas else None,
                    "best_over_cublas": statistics.geometric_mean(s["best"]["us"] / s["cublas"]["us"] for s in cublas)
                    if cublas else None})
        if copy_gbs and tflops:
            out[-1]["roofline"] = statistics.median(roofline_us(s, copy_gbs, tflops) / s["best"]["us"] for s in got)
    return out


READ_BANDS_MB = (1, 3, 10, 20, 40, 80, 150, 300, 1 << 20)


def reads_by_size(shapes: list[dict]) -> list[dict]:
    """Table 2: the read launch's median share of copy per band of bytes (every shape with a timed read)."""
    reads = [s for s in shapes if timed(s, "read")]
    out = []
    for low, high in zip(READ_BANDS_MB, READ_BANDS_MB[1:]):
        got = [s["read"]["share_of_copy"] for s in reads if low <= s["bytes"] / 1e6 < high]
        if got:
            out.append({"mb": f"{low}-{high}" if high < 1 << 20 else f"{low}+", "shapes": len(got),
                        "median": statistics.median(got), "low": min(got), "high": max(got)})
    return out


def read_line(shapes: list[dict]) -> tuple[float, float] | None:
    """A least-squares line through the GEMM shapes' read launches of 1 MB or more: (us a launch, GB/s);
    None with fewer than two such shapes of different sizes."""
    reads = [s for s in shapes if s["kind"] in GEMMS and timed(s, "read") and s["bytes"] >= 1e6]
    if len({s["bytes"] for s in reads}) < 2:
        return None
    slope, intercept = statistics.linear_regression([s["bytes"] / 1e6 for s in reads], [s["read"]["us"] for s in reads])
    return intercept, 1e3 / slope


AIMS = {"gemm": 0.85, "attention": 0.80}  # #49's share of copy for a launch alone


def aim_of(shape: dict) -> float:
    return AIMS["gemm"] if shape["kind"] in GEMMS else AIMS["attention"]


def launch_bound(shapes: list[dict], bound_gbs: float) -> dict | None:
    """Table 5: the fastest launch timed alone (any read launch, us), and per (model, kind) the shapes
    whose aim at `bound_gbs` needs less time than it, and those whose read here stayed under the aim."""
    timed_reads = [s for s in shapes if timed(s, "read")]
    reads = [s for s in timed_reads if not cpu_only(s)]
    if not reads:
        return None
    fastest = min(s["read"]["us"] for s in timed_reads)  # the tiny example's kilobytes included: a launch's floor
    groups: dict[tuple[str, str], dict] = {}
    for s in reads:
        g = groups.setdefault((s.get("model", "-"), s["kind"]), {"shapes": 0, "beyond": 0, "read_under": 0,
                                                               "largest_beyond_mb": 0.0})
        g["shapes"] += 1
        need_us = s["bytes"] / (aim_of(s) * bound_gbs * 1e3)
        if need_us < fastest:
            g["beyond"] += 1
            g["largest_beyond_mb"] = max(g["largest_beyond_mb"], s["bytes"] / 1e6)
        if s["read"]["share_of_copy"] < aim_of(s):
            g["read_under"] += 1
    return {"fastest_us": fastest, "bound_gbs": bound_gbs,
            "below_mb": {k: fastest * aim * bound_gbs * 1e3 / 1e6 for k, aim in AIMS.items()},
            "groups": [{"model": m, "kind": k, **g} for (m, k), g in sorted(groups.items())]}


def row_blocks(shapes: list[dict]) -> list[dict]:
    """Table 3: per GEMM whose rows exceed its shipped BLOCK_M, the comparisons of the docstring."""
    out = []
    for s in shapes:
        shipped = s["shipped"].get("plan_keys")
        if s["kind"] not in GEMMS or not shipped or "us" not in s["shipped"] or rows_of(s) <= shipped["BLOCK_M"]:
            continue
        if "error" in (s.get("read") or {}):  # too few bytes to time beside the L2 flush: noise
            continue
        want = min(64, 1 << (rows_of(s) - 1).bit_length())
        if want <= shipped["BLOCK_M"]:
            continue
        timed = [t for t in s["tried"] if "us" in t]
        at_want = [t["us"] for t in timed if t["plan_keys"]["BLOCK_M"] == want]
        at_shipped = [t["us"] for t in timed if t["plan_keys"]["BLOCK_M"] == shipped["BLOCK_M"]]
        factor = want // shipped["BLOCK_M"]

        def alone(keys: dict) -> list[float]:  # candidates with exactly these shape keys, any schedule
            return [s["shipped"]["us"] / t["us"] for t in timed
                    if all(t["plan_keys"][k] == v for k, v in keys.items() if k not in SCHEDULE_KEYS)]

        raised = shipped | {"BLOCK_M": want}
        out.append({"shape": s["shape"], "model": s["model"], "block_m": f"{shipped['BLOCK_M']}->{want}",
                    "best_taller": min(at_shipped) / min(at_want) if at_want and at_shipped else None,
                    "raised_alone": alone(raised),
                    "raised_narrower": alone(raised | {"BLOCK_N": max(16, shipped["BLOCK_N"] // factor)})})
    return out


def against(shapes: list[dict], other_shapes: list[dict], other_name: str) -> dict | None:
    """Table 4: this sweep's best tiles against another sweep's on the shapes both timed with cuBLAS
    beside them (each ratio within its own process, then across the two): None where none is shared."""
    other = {(s["shape"], s["model"]): s for s in other_shapes if s.get("best") and timed(s, "cublas")}
    pairs = [(s, other[(s["shape"], s["model"])]) for s in shapes
             if s.get("best") and timed(s, "cublas") and (s["shape"], s["model"]) in other]
    if not pairs:
        return None
    here = [s["best"]["us"] / s["cublas"]["us"] for s, _ in pairs]
    by_rows: dict[int, list[float]] = {}
    for (s, _), r in zip(pairs, here):
        by_rows.setdefault(rows_of(s), []).append(r)
    across = [o["best"]["us"] / s["best"]["us"] for s, o in pairs]
    return {"other": other_name, "shapes": len(pairs),
            "tall": sum(s["best"]["plan_keys"]["BLOCK_M"] >= 128 for s, _ in pairs),
            "best_over_cublas": statistics.geometric_mean(here), "low": min(here), "high": max(here),
            "by_rows": {r: statistics.geometric_mean(v) for r, v in sorted(by_rows.items())},
            "other_best_over_cublas": statistics.geometric_mean(o["best"]["us"] / o["cublas"]["us"] for _, o in pairs),
            "cublas_here_over_other": statistics.geometric_mean(s["cublas"]["us"] / o["cublas"]["us"] for s, o in pairs),
            "other_best_over_best": statistics.geometric_mean(across), "across_low": min(across),
            "across_high": max(across), "other_faster": sum(a < 1 for a in across)}


def print_bands(rows: list[dict]) -> None:
    def share(x: float | None, width: int) -> str:
        return f"{x:{width}.0%}" if x is not None else f"{'-':>{width}}"

    print(f"{'model':7} {'rows':>8} {'shapes':>6} {'shipped':>8} {'best':>6} {'>=85%':>6} {'read':>6} {'best/shipped':>12}"
          f" {'cuBLAS (shapes)':>15} {'best/cuBLAS time':>16} {'best, of roofline':>17}")
    for b in rows:
        over = f"{b['best_over_cublas']:15.2f}x" if b["best_over_cublas"] else f"{'-':>16}"
        print(f"{b['model']:7} {b['rows']:>8} {b['shapes']:6d} {b['shipped']:8.0%} {b['best']:6.0%} {b['at_85']:6d} "
              f"{share(b['read'], 6)} {b['gain']:11.2f}x {share(b['cublas'], 9)} ({b['cublas_shapes']:3d}) {over} "
              f"{share(b.get('roofline'), 17)}")


def print_against(a: dict | None) -> None:
    if a is None:
        print("\n--against: no shape timed beside cuBLAS in both sweeps")
        return
    rows = ", ".join(f"{r}: {v:.2f}x" for r, v in a["by_rows"].items())
    print(f"\nagainst {a['other']}, {a['shapes']} shapes: {a['tall']} best tiles with BLOCK_M 128 or more; best / cuBLAS "
          f"{a['best_over_cublas']:.3f}x ({a['low']:.2f}-{a['high']:.2f}x; by rows {rows}), there "
          f"{a['other_best_over_cublas']:.3f}x; cuBLAS here / there {a['cublas_here_over_other']:.3f}x; its best / "
          f"this best {a['other_best_over_best']:.3f}x ({a['across_low']:.2f}-{a['across_high']:.2f}x, its faster on "
          f"{a['other_faster']})")


def print_launch_bound(b: dict | None) -> None:
    if b is None:
        print("\n--bound: no read launch timed in these sweeps")
        return
    print(f"\nthe fastest launch timed alone: {b['fastest_us']:.2f} us; at {b['bound_gbs']:.0f} GB/s the aims need "
          f"less below {b['below_mb']['gemm']:.1f} MB (GEMMs, 85%) and {b['below_mb']['attention']:.1f} MB "
          f"(attention, 80%)")
    print(f"{'model':>7} {'kind':>9} {'shapes':>6} {'beyond at bound':>15} {'largest MB':>10} "
          f"{'read under aim here':>19}")
    for g in b["groups"]:
        print(f"{g['model']:>7} {g['kind']:>9} {g['shapes']:6d} {g['beyond']:15d} {g['largest_beyond_mb']:10.1f} "
              f"{g['read_under']:19d}")


def print_row_blocks(blocks: list[dict]) -> None:
    ratios = [r["best_taller"] for r in blocks if r["best_taller"]]
    alone = [x for r in blocks for x in r["raised_alone"]]
    narrower = [x for r in blocks for x in r["raised_narrower"]]
    if not (ratios or alone or narrower):  # a sweep of known tiles (--tiles-from) has no candidates to compare
        print("\ntable 3: no candidates at another BLOCK_M in these sweeps")
        return
    print(f"\n{'shape':26} {'model':6} {'BLOCK_M':>7} {'best taller/best shipped':>24}  raised alone; raised, BLOCK_N cut")
    for r in blocks:
        taller = f"{r['best_taller']:.3f}" if r["best_taller"] else "-"
        print(f"{r['shape']:26} {r['model']:6} {r['block_m']:>7} {taller:>24}  "
              f"{[round(x, 2) for x in r['raised_alone']]}; {[round(x, 2) for x in r['raised_narrower']]}")
    if ratios:
        print(f"best taller / best at the shipped BLOCK_M: {statistics.geometric_mean(ratios):.2f}x geometric mean "
              f"over {len(ratios)}; raised alone {min(alone, default=0):.2f}-{max(alone, default=0):.2f}x; "
              f"with BLOCK_N cut {min(narrower, default=0):.2f}-{max(narrower, default=0):.2f}x")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sweep", type=Path, help="the serving-size sweep (kernel_sweep.py --read)")
    parser.add_argument("--also", nargs="*", type=Path, default=[], help="more sweeps for tables 2 and 3")
    parser.add_argument("--against", type=Path, metavar="SWEEP.json",
                        help="table 4: this sweep's best tiles against that one's, each beside cuBLAS (--cublas)")
    parser.add_argument("--bound", type=float, metavar="GBS",
                        help="table 5: the shapes whose #49 aim at this copy rate needs less than any launch took")
    args = parser.parse_args()
    try:
        sweep = json.loads(args.sweep.read_text())
        main_shapes, copy_gbs, tflops = sweep["shapes"], sweep["copy_gbs"], sweep.get("matmul_tflops")
        more = [s for p in args.also for s in json.loads(p.read_text())["shapes"]]
        other = json.loads(args.against.read_text())["shapes"] if args.against else []
    except (OSError, ValueError, KeyError, TypeError) as error:
        print(f"serving_rows.py: not a kernel_sweep.py result ({type(error).__name__}: {error})", file=sys.stderr)
        return 2
    if tflops:
        print(f"copy {copy_gbs:.0f} GB/s, dense bf16 {tflops:.0f} TFLOP/s: the ridge at {tflops * 1e3 / copy_gbs:.0f} rows")
    print_bands(bands(main_shapes, copy_gbs, tflops))
    line = read_line(main_shapes)
    if line:
        print(f"\n{'read MB':>9} {'shapes':>6} {'median':>6} {'range':>9}   (this sweep and --also's)")
        for r in reads_by_size(main_shapes + more):
            print(f"{r['mb']:>9} {r['shapes']:6d} {r['median']:6.0%} {r['low']:4.0%}-{r['high']:.0%}")
        print(f"the GEMMs' reads: {line[0]:.1f} us a launch plus the bytes at {line[1]:.0f} GB/s "
              f"({line[1] / copy_gbs:.0%} of copy)")
    if args.against:
        print_against(against(main_shapes, other, args.against.name))
    print_row_blocks(row_blocks(main_shapes + more))
    if args.bound:
        print_launch_bound(launch_bound(main_shapes + more, args.bound))
    return 0


if __name__ == "__main__":
    sys.exit(main())
