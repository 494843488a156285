"""Suite-wide setup: a quicker Triton interpreter for the kernels the tests run in this process."""
from __future__ import annotations

import dataclasses
import inspect
import threading
import weakref

import pytest

import conjugate  # noqa: F401  (selects the interpreter before triton is imported)
import triton
import triton.language as tl
from triton.runtime import interpreter

# The interpreter patches triton.language for each launch, and again at every call of a @triton.jit
# device function inside it (thousands a round): about a quarter of a round's time, spent patching
# modules the launch has already patched, with the same builder. Within a launch, a device function
# whose language modules are all patched already is called without patching them again; the kernels
# run exactly as before. Triton is pinned (pyproject.toml): another version runs its own code untouched.
if triton.__version__ == "3.6.0" and hasattr(interpreter, "_patch_lang"):
    _patch_lang, _launch = interpreter._patch_lang, interpreter.GridExecutor.__call__
    _patched = threading.local()  # per thread, the stack of launches: the modules each patched so far

    _scopes = weakref.WeakKeyDictionary()  # function -> its language modules: a scan of its globals, once

    def _modules(fn) -> frozenset[int]:
        if fn not in _scopes:
            _scopes[fn] = frozenset(id(v) for v in fn.__globals__.values() if inspect.ismodule(v) and v in (tl, tl.core))
        return _scopes[fn]

    def _patch_lang_once(fn):
        stack = getattr(_patched, "stack", None)
        if stack:
            modules = _modules(fn)
            if modules <= stack[-1]:
                return None  # a device function's call: its scope is never restored, none is needed
            stack[-1] |= modules
        return _patch_lang(fn)

    def _launch_patching_once(self, *args, **kwargs):
        stack = _patched.__dict__.setdefault("stack", [])
        stack.append(set())
        try:
            return _launch(self, *args, **kwargs)
        finally:
            stack.pop()

    interpreter._patch_lang = _patch_lang_once
    interpreter.GridExecutor.__call__ = _launch_patching_once

# Every int32 add, sub and mul under the interpreter is redone in int64 and compared with int32's range
# (sanitize_overflow): some 40% of a round's time. Its result goes to device_assert, which drops it
# unless the builder's debug option is on, and the interpreter's never is: the work checks nothing.
# Off only while debug is off, so a run that does check overflows still does.
if not interpreter.interpreter_builder.options.debug:
    interpreter.interpreter_builder.options = dataclasses.replace(interpreter.interpreter_builder.options,
                                                                  sanitize_overflow=False)


@pytest.fixture(scope="module")
def _close_shared_workers():
    yield
    from shared_worker import SharedWorkerEvaluator

    SharedWorkerEvaluator.close_idle()


@pytest.fixture
def shared_worker(monkeypatch, _close_shared_workers):
    """In-process searches of this test adopt the worker process an earlier one left (tests/shared_worker.py);
    the module's idle workers are closed after its last test."""
    from conjugate.evaluate import worker
    from shared_worker import SharedWorkerEvaluator

    monkeypatch.setattr(worker, "IsolatedEvaluator", SharedWorkerEvaluator)
