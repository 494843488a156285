"""lab/experiments/dataflow_chain.py under the interpreter: the dataflow chain kernel (one program, as the
interpreter runs programs one after another) computes the chain, with and without its prefetch."""
from __future__ import annotations

import pytest
import torch

import conjugate  # noqa: F401  (selects the interpreter before triton is imported)
from experiment_scripts import load_script  # lab/experiments/tests/experiment_scripts.py

chain = load_script("dataflow_chain")


@pytest.mark.parametrize("prefetch", [True, False])
def test_the_dataflow_chain_computes_the_chain(prefetch):
    x0, w = chain.chain_inputs(16, 3, 5, "cpu")
    w = w.float()  # the interpreter's bf16 arithmetic is wrong; the GPU runs bf16
    run, result = chain.dataflow(x0, w, 1, prefetch)
    for _ in range(2):  # counters and buffers start over each run
        run()
        assert chain.relative_error(result(), chain.reference(x0, w.bfloat16().float())) < 1e-2


def test_a_chain_that_does_not_divide_into_blocks_is_refused():
    x0, w = chain.chain_inputs(24, 3, 2, "cpu")
    with pytest.raises(ValueError, match="16-column blocks"):
        chain.dataflow(x0, w, 1, True)
