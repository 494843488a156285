"""Why an fp32 attention output costs more per split, read from the SASS (no GPU: Triton's compiler
and bundled ptxas for sm_90a, as `python -m conjugate.compiler.offline` uses them).

    python lab/attention_combine/sass.py

harness_gap.py's launch (llama-3.1-8b's verify attention at B=1, context 1024, BLOCK_N 64, 4 warps,
3 stages) at SPLIT_KV 8 and 16, writing fp32 and bf16: the kernel's registers and its global loads
and stores by form (`.STRONG.GPU`: the merge's `.cg` loads of the partials). Lab code.
"""
from __future__ import annotations

import collections
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

os.environ["TRITON_INTERPRET"] = "0"  # compile for the GPU, even on a machine without one
sys.path.insert(0, str(Path(__file__).resolve().parent))

import harness_gap as hg  # noqa: E402  (puts the repository and benchmarks/ on the path)
import torch  # noqa: E402

from conjugate.compiler.cache import KernelCache  # noqa: E402
from conjugate.compiler.offline import _Triton  # noqa: E402


def main() -> int:
    compiler = _Triton(90)
    inputs = hg.ks.operands(hg.SHAPE, "cpu")
    print(f"{'SPLIT_KV':>8} {'output':>8} {'registers':>9}  global loads and stores")
    with tempfile.TemporaryDirectory() as tmp:
        for split in (8, 16):
            for dtype in (torch.float32, torch.bfloat16):
                launch, _ = hg.launch_of(inputs, split, dtype, KernelCache(Path(tmp)))
                _, (source, options) = compiler.bind(launch)
                compiled = compiler.triton.compile(source, target=compiler.target, options=options)
                cubin = Path(tmp) / "kernel.cubin"
                cubin.write_bytes(compiled.asm["cubin"])
                sass = subprocess.run([compiler.cuobjdump, "-sass", str(cubin)], capture_output=True, text=True,
                                      check=True).stdout
                forms = collections.Counter(re.findall(r"\b((?:LDG|STG)\.E[\w.]*)", sass))
                registers = compiler.compile(source, options).registers  # Triton's cache: no second build
                print(f"{split:8d} {str(dtype).split('.')[-1]:>8} {registers:9d}  "
                      + ", ".join(f"{form} {n}" for form, n in sorted(forms.items())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
