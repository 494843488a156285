"""lab/experiments/seed_choices.py keeps an earlier run's conventional choice only where that run chose it
from every variant the profile lists, and chose the pair for two streams too."""
from __future__ import annotations

import json
from pathlib import Path

import torch

from conjugate.evaluate.baselines.measure import CHOICE_KEYS, choice_file
from conjugate.evaluate.evaluators import load_profile
from conjugate.paths import EXAMPLES_DIR
from conjugate.workload import load_workload
from experiment_scripts import load_script  # lab/experiments/tests/experiment_scripts.py

ROOT = Path(__file__).resolve().parents[3]


def _seed_module():
    return load_script("seed_choices")


def test_only_choices_made_from_every_listed_variant_with_a_streams_pair_are_kept(tmp_path, monkeypatch):
    monkeypatch.setenv("CONJUGATE_CACHE", str(tmp_path))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # the device name seed() compares with
    variants = list(load_profile("h200").timing.conventional)
    trials = [{"variant": v, "correct": True, "phase_ms": {"draft": 1.0, "verify": 1.0}} for v in variants]
    pair = {"draft": variants[0], "verify": variants[1]}
    rows = [{"workload": "llama-1b-8b-b1", "variants": {"draft": variants[1], "verify": variants[2]},
             "streams_variants": pair, "streams_pairs_ms": {"a/b": 1.0}, "trials": trials},
            {"workload": "llama-1b-8b-b8", "variants": pair, "trials": trials},  # no streams pair: chosen before it
            {"workload": "qwen3-06b-8b-b4", "variants": pair, "streams_variants": pair,
             "trials": trials[1:]},  # chosen from fewer variants than the profile now lists
            {"workload": "qwen25-05b-7b-b8", "variants": {"draft": "whole-flex", "verify": variants[0]},
             "streams_variants": pair, "trials": trials + [{"variant": "whole-flex"}]}]  # chose one it no longer lists
    results = tmp_path / "baselines.json"
    results.write_text(json.dumps({"gpu": "triton-interpreter", "torch": torch.__version__, "workloads": rows}))
    kept = _seed_module().seed(results, "h200")
    assert len(kept) == 1 and kept[0].startswith("llama-1b-8b-b1: ")
    timing = load_profile("h200").timing
    path = choice_file(load_workload(EXAMPLES_DIR / "llama-1b-8b-b1.toml"), "triton-interpreter", timing, None)
    written = json.loads(path.read_text())
    assert {k: written[k] for k in CHOICE_KEYS} == {"draft": variants[1], "verify": variants[2],
                                                     "streams_draft": variants[0], "streams_verify": variants[1]}
    for name in ("llama-1b-8b-b8", "qwen3-06b-8b-b4", "qwen25-05b-7b-b8"):
        assert not choice_file(load_workload(EXAMPLES_DIR / f"{name}.toml"), "triton-interpreter", timing,
                               None).exists()
