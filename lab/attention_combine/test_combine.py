"""combine.py's attention under the Triton interpreter (CPU): the normalised partials and the weighed
merge compute torch's SDPA as the product does, at split counts that are and are not powers of two,
past the unrolled merge, with splits that see no key (ragged lengths), launch after launch.

    python -m pytest -q lab/attention_combine
"""
import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import importlib.util  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

HERE = Path(__file__).resolve().parent


def _load(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


sys.path.insert(0, str(HERE))  # combine, for the generated kernel's import
time_merge = _load(HERE / "time_merge.py", "lab_time_merge")


@pytest.mark.parametrize("split,ragged", [(1, False), (3, True), (4, False), (20, True)])
def test_the_weighed_merge_computes_attention(split, ragged, monkeypatch):
    from conjugate.compiler.cache import KernelCache

    monkeypatch.setattr(time_merge.dealing, "DEVICE", "cpu")
    batch, tokens, heads, kv_heads, hd, context = 3, 3, 4, 2, 16, 70
    data = time_merge.dealing.inputs(batch, tokens, heads, kv_heads, hd, context, ragged, seed=split)
    data["k"], data["v"] = data["k"].float(), data["v"].float()  # the interpreter's operand type
    with tempfile.TemporaryDirectory() as tmp:
        cache = KernelCache(Path(tmp))
        got = {}
        for kind in time_merge.KINDS:
            launch, out = time_merge.build(kind, data, batch, tokens, heads, kv_heads, hd, split, cache, 4, "cpu")
            errors = [time_merge.check(launch, out, data) for _ in range(2)]  # the counters reset themselves
            assert max(errors) < 1e-2, (kind, errors)
            got[kind] = out.float().clone()
    assert (got["combine"] - got["product"]).abs().max() < 2e-2  # bf16 outputs of the same sums
