"""compare.py's per-shape row on the CPU: the interpreter runs every launch, the timer is stubbed."""
from __future__ import annotations

import os
import sys
from functools import partial
from pathlib import Path

os.environ.setdefault("TRITON_INTERPRET", "1")
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import torch  # noqa: E402

import compare  # noqa: E402  (puts the checkout and benchmarks/ on the path)
import kernel_sweep as ks  # noqa: E402


def test_a_shape_past_128_rows_gives_cublas_the_template_and_every_tall_form_checked(monkeypatch, tmp_path):
    import conjugate.evaluate.timing as timing

    monkeypatch.setattr(ks, "operands", partial(ks.operands, device="cpu"))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    monkeypatch.setattr(timing, "time_per_call", lambda call, device, calls, flush_bytes=0: 7.0)
    monkeypatch.setattr(timing, "l2_flush_bytes", lambda device: 0)
    entry = {"shape": "down 130x32x64", "kind": "down", "fields": {"rows": 130, "n": 32, "k": 64},
             "best": {"block_m": 64, "block_n": 32, "block_k": 32, "split_k": 2, "warps": 4, "stages": 2, "tma": 0,
                      "plan_keys": {"BLOCK_M": 64, "BLOCK_N": 32, "BLOCK_K": 32, "SPLIT_K": 2}}}
    row = compare.compare_shape(entry, tmp_path, sms=2, device=torch.device("cpu"))
    assert row["cublas"]["us"] == 7.0 and row["template"]["us"] == 7.0 and row["template"]["rel_err"] < 1e-2
    assert len(row["tall"]) == len(compare.FORMS)
    for tall in row["tall"]:
        assert tall["us"] == 7.0 and tall["rel_err"] < 1e-2, tall
    assert [t["programs"] for t in row["tall"]] == [2, 2, 2, 2]  # 2 row blocks x 1 column block; persistent: 2 SMs


def test_a_wrong_launch_is_a_row_not_the_end(monkeypatch):
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    out, ref = torch.zeros(4, 4), torch.ones(4, 4)
    assert "wrong" in compare.checked_us(lambda: None, out, ref, torch.device("cpu"), 0)["error"]  # NaN left
    assert "RuntimeError" in compare.checked_us(lambda: (_ for _ in ()).throw(RuntimeError("no")), out, ref,
                                                torch.device("cpu"), 0)["error"]
