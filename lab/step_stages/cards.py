"""The step launch on two cards: is its draft phase bound by bytes or by its dependent chain? From two
committed draft_step JSONs (benchmarks/draft_step.py), per workload in both: each card's byte floor and
step launch, the ratio of the times against the ratio of the floors, and what #48's aim (within 1.35x
of the floor) leaves a stage there, all of it and beyond its bytes. CPU only.

    python lab/step_stages/cards.py benchmarks/results/draft_step_aims_h100.json \
        benchmarks/results/draft_step_h200.json
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

AIM = 1.35  # #48: the draft phase within 1.35x of its byte floor


def phases(path: Path) -> tuple[str, dict]:
    data = json.loads(path.read_text())
    return data["gpu"], {p["workload"]: p for p in data["phases"]}


def rows(first: Path, second: Path) -> list[str]:
    gpu_a, a = phases(first)
    gpu_b, b = phases(second)
    lines = [f"A: {gpu_a} ({first.name}); B: {gpu_b} ({second.name}); ms, us a stage",
             "| workload | stages | floor A | step A | floor B | step B | B/A floor | B/A step | "
             "B's us a stage | aim's us a stage on B | aim's beyond bytes on B |",
             "|" + "---|" * 11]
    for name in a:
        if name not in b:
            continue
        pa, pb = a[name], b[name]
        stages = pb["ledger"]["stages"]
        floor_b, step_b = pb["floor_ms"] * 1e3, pb["step_kernel_ms"] * 1e3
        lines.append(f"| {name} | {stages} | {pa['floor_ms']:.3f} | {pa['step_kernel_ms']:.3f} | "
                     f"{pb['floor_ms']:.3f} | {pb['step_kernel_ms']:.3f} | "
                     f"{pb['floor_ms'] / pa['floor_ms']:.2f} | {pb['step_kernel_ms'] / pa['step_kernel_ms']:.2f} | "
                     f"{step_b / stages:.2f} | {AIM * floor_b / stages:.2f} | {(AIM - 1) * floor_b / stages:.2f} |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("first", type=Path)
    parser.add_argument("second", type=Path)
    args = parser.parse_args()
    print("\n".join(rows(args.first, args.second)))


if __name__ == "__main__":
    main()
