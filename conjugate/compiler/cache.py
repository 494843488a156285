"""The generated kernels' cache: modules written once, named by the hash of their text, and imported."""
from __future__ import annotations

import hashlib
import importlib.util
import sys
from pathlib import Path

from conjugate.files import write_atomic


class KernelCache:
    """Writes generated modules to `directory` (named by the hash of their text) and imports them.
    A source is imported once per process, whichever directory asks: a long-lived evaluation worker
    does not load the same kernel again for every plan."""

    _loaded: dict[str, object] = {}  # digest -> kernel, shared by every cache of this process

    def __init__(self, directory: Path):
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)

    def load(self, source: str):
        """The kernel of `source` and its digest. The module names its entry point `k_<digest>`, as
        its file is named, so that profiler records name the kernel (ledger.py)."""
        digest = hashlib.sha256(source.encode()).hexdigest()[:16]
        entry = f"k_{digest}"
        text = source.replace("\ndef kernel(", f"\ndef {entry}(", 1)
        path = self.directory / f"{entry}.py"
        if not path.exists() or path.read_text() != text:
            write_atomic(path, text)  # a concurrent reader never sees half a file
        if digest in self._loaded:
            return self._loaded[digest], digest
        name = f"conjugate_generated.{entry}"
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
        self._loaded[digest] = getattr(module, entry)
        return self._loaded[digest], digest
