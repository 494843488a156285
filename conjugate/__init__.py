"""Conjugate: compile the draft and target models of speculative decoding together."""
import os as _os

# Triton kernels run under the interpreter where there is no GPU; it must be chosen before
# `import triton`, so it is decided here, once, for every module of the package.
if "TRITON_INTERPRET" not in _os.environ:
    import torch as _torch

    if not _torch.cuda.is_available():
        _os.environ["TRITON_INTERPRET"] = "1"

# No log record of a process that imports the package carries an API key (conjugate/secrets.py).
from conjugate.secrets import scrub_log_records as _scrub_log_records

_scrub_log_records()

__version__ = "0.1.0"
