"""Two versions of the attention template side by side, from `kernel_sweep.py --kinds attn` runs and
`conjugate bench` runs of each version (the older one from `git archive` of its commit).

    python lab/experiments/attention_compare.py --before SWEEP.json --after SWEEP.json \
        [--rounds BEFORE_BENCH.json AFTER_BENCH.json ...] [--json OUT.json]

Per attention shape, the shipped tile's time alone in each sweep and their ratio (after / before);
per pair of bench files (same workload, same plans), each plan's round latency in both and the
ratio. Measures nothing: it reads the files (a bench file may be xz-compressed, FILE.json.xz).
"""
from __future__ import annotations

import argparse
import json
import lzma
import statistics
import sys
from pathlib import Path


def _read(path: Path, what: str) -> dict:
    try:
        raw = lzma.decompress(path.read_bytes()) if path.suffix == ".xz" else path.read_bytes()
        data = json.loads(raw)
    except (OSError, lzma.LZMAError, json.JSONDecodeError, UnicodeDecodeError) as e:
        raise SystemExit(f"{path}: cannot read {what}: {e}")
    if not isinstance(data, dict):
        raise SystemExit(f"{path}: not {what}")
    return data


def _positive(value, path: Path, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise SystemExit(f"{path}: {where}: no positive time ({value!r})")
    return float(value)


def _shipped_us(sweep: dict, path: Path) -> dict[str, float]:
    if not isinstance(sweep.get("shapes"), list):
        raise SystemExit(f"{path}: not a kernel_sweep.py file (no 'shapes')")
    out = {}
    for i, s in enumerate(sweep["shapes"]):
        if not isinstance(s, dict) or not isinstance(s.get("shipped"), dict):
            raise SystemExit(f"{path}: shapes[{i}]: not a sweep entry with a shipped tile")
        if s.get("kind") == "attn":
            key = f"{s.get('model')} {s.get('shape')}"
            if key in out:
                raise SystemExit(f"{path}: shapes[{i}]: {key} twice")
            out[key] = _positive(s["shipped"].get("us"), path, f"shapes[{i}].shipped.us ({s['shipped'].get('error')})")
    return out


def kernels(before: Path, after: Path) -> list[dict]:
    old, new = _shipped_us(_read(before, "a sweep"), before), _shipped_us(_read(after, "a sweep"), after)
    return [{"shape": k, "before_us": old[k], "after_us": new[k], "ratio": new[k] / old[k]} for k in old if k in new]


def _latencies(bench: dict, path: Path) -> dict[str, float]:
    if not isinstance(bench.get("plans"), list):
        raise SystemExit(f"{path}: not a `conjugate bench --json` file (no 'plans')")
    out = {}
    for i, p in enumerate(bench["plans"]):
        result = p.get("result") if isinstance(p, dict) else None
        if not isinstance(result, dict) or not isinstance(p.get("label"), str) or p["label"] in out:
            raise SystemExit(f"{path}: plans[{i}]: not a labelled result, or a label seen before")
        if result.get("status") != "ok" or not isinstance(result.get("metrics"), dict):
            raise SystemExit(f"{path}: plan {p['label']}: {result.get('status')}, no latency to compare")
        out[p["label"]] = _positive(result["metrics"].get("latency_ms"), path, f"plan {p['label']}")
    return out


def rounds(pairs: list[tuple[Path, Path]]) -> list[dict]:
    out = []
    for before, after in pairs:
        old_bench, new_bench = _read(before, "a bench file"), _read(after, "a bench file")
        if old_bench.get("workload") != new_bench.get("workload"):
            raise SystemExit(f"{after}: workload {new_bench.get('workload')!r}, not {before}'s "
                             f"{old_bench.get('workload')!r}")
        old, new = _latencies(old_bench, before), _latencies(new_bench, after)
        for label in old:
            if label in new:
                out.append({"workload": old_bench.get("workload"), "plan": label, "before_ms": old[label],
                            "after_ms": new[label], "ratio": new[label] / old[label]})
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", type=Path, required=True, help="kernel_sweep.py JSON of the older template")
    parser.add_argument("--after", type=Path, required=True, help="kernel_sweep.py JSON of the newer template")
    parser.add_argument("--rounds", type=Path, nargs="*", default=[], metavar="BENCH.json",
                        help="pairs of `conjugate bench --json` files: before, after, before, after, ...")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if len(args.rounds) % 2:
        raise SystemExit("--rounds takes pairs of files (before, after)")
    shapes = kernels(args.before, args.after)
    rows = rounds(list(zip(args.rounds[::2], args.rounds[1::2])))
    result = {"gpu": _read(args.after, "a sweep").get("gpu"), "before": str(args.before), "after": str(args.after),
              "kernels": shapes, "rounds": rows,
              "kernel_ratio_median": statistics.median(s["ratio"] for s in shapes) if shapes else None}
    for s in shapes:
        print(f"{s['shape']:45} {s['before_us']:7.1f} {s['after_us']:7.1f} us  {s['ratio']:.3f}")
    for r in rows:
        print(f"{r['workload']} {r['plan']:35} {r['before_ms']:7.3f} {r['after_ms']:7.3f} ms  {r['ratio']:.3f}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    sys.exit(main())
