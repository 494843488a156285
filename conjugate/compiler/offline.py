"""Compile a round's kernels for an NVIDIA GPU on a machine without one: Triton's compiler and its
bundled ptxas build each launch's generated kernel for a target arch (default 90, Hopper), and its
bundled cuobjdump reads back the kernel's registers and local memory; per launch, the Resources a
GPU's warmup would report (spills as Triton counts them: local bytes / 4; shared: Triton's dynamic
shared memory, checked against Hopper's limit on sm_90).

    python -m conjugate.compiler.offline PLAN.json --workload W.toml [--arch 90]

The entry point lowers the plan on shape-only (meta) weights. Triton's compiler, not its interpreter:
TRITON_INTERPRET must be 0 before triton is imported (the entry point sets it). The Triton internals
used (3.6) are all resolved in `_Triton`, so a Triton without them fails there, in one line.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # imported for real only once TRITON_INTERPRET is settled (main)
    from conjugate.compiler.feedback import Resources
    from conjugate.compiler.round import CompiledLaunch, CompiledRound


class _Triton:
    """Every Triton internal this module uses, for one target arch (a one-line error where the bundled
    ptxas does not know the arch: LLVM would abort the process)."""

    def __init__(self, arch: int):
        from conjugate.errors import ConjugateError

        try:
            import triton
            from triton import knobs
            from triton.backends.compiler import GPUTarget
            from triton.backends.nvidia.compiler import get_ptxas, sm_arch_from_capability
            from triton.compiler import ASTSource, make_backend
            from triton.runtime.jit import JITFunction, create_function_from_signature

            JITFunction._pack_args  # noqa: B018  (private: binds arguments as JITFunction.run does)
            sm, ptxas, self.cuobjdump = sm_arch_from_capability(arch), get_ptxas(arch).path, knobs.nvidia.cuobjdump.path
        except (ImportError, AttributeError) as e:
            raise ConjugateError(f"offline compiling needs Triton 3.6's compiler internals, which Triton "
                                 f"{getattr(sys.modules.get('triton'), '__version__', '?')} lacks ({e})") from None
        known = subprocess.run([ptxas, f"--gpu-name={sm}", "--version"], capture_output=True, text=True)
        if known.returncode != 0:
            said = (known.stderr.strip().splitlines() or [f"exit status {known.returncode}"])[-1]
            raise ConjugateError(f"arch {arch}: Triton's bundled ptxas does not compile for {sm} ({said})")
        self.triton, self.knobs, self.ast_source = triton, knobs, ASTSource
        self.target = GPUTarget("cuda", arch, 32)
        self.backend, self.binder_of = make_backend(self.target), create_function_from_signature
        self._binders: dict[str, object] = {}

    def bind(self, launch: CompiledLaunch) -> tuple[tuple, tuple]:
        """(the compile key: kernel, specialization and options; what triton.compile takes)."""
        kernel = launch.kernel
        if launch.digest not in self._binders:
            self._binders[launch.digest] = self.binder_of(kernel.signature, kernel.params, self.backend)
        kwargs = {**launch.constexprs, "num_warps": launch.num_warps, "num_stages": launch.num_stages,
                  "launch_pdl": launch.pdl, "debug": kernel.debug or self.knobs.runtime.debug}
        bound, specialization, options = self._binders[launch.digest](*launch.args, **kwargs)
        options, signature, constexprs, attrs = kernel._pack_args(self.backend, kwargs, bound, specialization, options)
        key = (launch.digest, repr(specialization), repr(sorted(options.__dict__.items())))
        return key, (self.ast_source(kernel, signature, constexprs, attrs), options.__dict__)

    def bind_step(self, step) -> tuple[tuple, tuple]:
        """bind() of a step launch (compiler/step): its Gluon kernel over the launch's meta buffers."""
        launch = step.launch
        return self.bind_gluon(type(launch).kernel, launch.args(), launch.kwargs, step.digest)

    def bind_gluon(self, kernel, args: tuple, kwargs: dict, digest: str) -> tuple[tuple, tuple]:
        """bind() of a Gluon kernel's launch (a step or streamed launch) over its meta buffers."""
        from triton.experimental.gluon._runtime import GluonASTSource

        kwargs = {**kwargs, "debug": kernel.debug or self.knobs.runtime.debug}
        binder = self.binder_of(kernel.signature, kernel.params, self.backend)
        bound, specialization, options = binder(*args, **kwargs)
        options, signature, constexprs, attrs = kernel._pack_args(self.backend, kwargs, bound, specialization, options)
        key = (digest, repr(specialization), repr(sorted(options.__dict__.items())))
        return key, (GluonASTSource(kernel, signature, constexprs, attrs), options.__dict__)

    def compile(self, source, options: dict) -> Resources:
        from conjugate.compiler.feedback import Resources

        with contextlib.redirect_stdout(io.StringIO()):  # a failing ptxas prints the whole PTX
            compiled = self.triton.compile(source, target=self.target, options=options)
        with tempfile.TemporaryDirectory() as tmp:
            cubin = Path(tmp) / "kernel.cubin"
            cubin.write_bytes(compiled.asm["cubin"])
            usage = subprocess.run([self.cuobjdump, "--dump-resource-usage", str(cubin)], capture_output=True,
                                   text=True, check=True).stdout
        regs, local = (int(re.search(rf"\b{field}:(\d+)", usage).group(1)) for field in ("REG", "LOCAL"))
        return Resources(regs, local // 4, compiled.metadata.shared)


def _reason(e: Exception) -> str:
    """One line of a Triton compile error: its innermost cause's (a CompilationError's cause is the
    message; its own text is source and a caret), ptxas's own error line where it has one
    (`ptxas ..., line 7; error   : ...`)."""
    inner = e
    while inner.__cause__ is not None:
        inner = inner.__cause__
    lines = [line.strip() for line in str(inner).splitlines() if line.strip(" ^")] or [""]
    own = [line for line in lines if re.search(r"\b(error|fatal)\s+:", line)]
    return f"{type(e).__name__}: {(own or lines[-1:])[0]}"


def compile_resources(compiled: CompiledRound, arch: int = 90) -> list[Resources]:
    """Per launch of `compiled`, its kernel compiled for sm_`arch` and the compiler's resource report;
    identical kernels (same source, specialization and options) are compiled once. CompileError
    (naming the launch and its ops) where a kernel does not compile or does not fit the arch;
    ConjugateError where the arch or this Triton cannot be used."""
    from conjugate.compiler.device import HOPPER_SHARED_BYTES
    from conjugate.compiler.round import _compile_error
    from conjugate.compiler.step.compiled import CompiledStep
    from conjugate.compiler.streamed import CompiledStreamed
    from conjugate.compiler.tile import INTERPRETING
    from conjugate.errors import ConjugateError

    if INTERPRETING:
        raise ConjugateError("offline compiling needs Triton's compiler: set TRITON_INTERPRET=0 before "
                             "importing triton or conjugate")
    tools = _Triton(arch)
    done: dict[tuple, Resources] = {}
    out = []
    for launch in compiled.launches:
        planned = compiled.schedule.launches[launch.index]
        if isinstance(launch, CompiledStep):
            key, (source, options) = tools.bind_step(launch)
        elif isinstance(launch, CompiledStreamed):
            key, (source, options) = tools.bind_gluon(*launch.gluon_launch(), launch.digest)
        else:
            key, (source, options) = tools.bind(launch)
        if key not in done:
            try:
                done[key] = tools.compile(source, options)
            except Exception as e:
                if not type(e).__module__.startswith("triton"):
                    raise
                raise _compile_error(planned, None, _reason(e)) from e
        if arch == 90 and done[key].shared_bytes > HOPPER_SHARED_BYTES:  # the one limit known here
            raise _compile_error(planned, None, f"needs {done[key].shared_bytes} bytes of shared memory; "
                                                f"sm_90 gives a program {HOPPER_SHARED_BYTES}")
        out.append(done[key])
    return out


def _table(compiled: CompiledRound, resources: list[Resources]) -> str:
    rows = [("launch", "ops", "regs", "spills", "shared")]
    rows += [(str(launch.index), " | ".join(p.label for p in launch.parts), str(r.registers), str(r.spills),
              str(r.shared_bytes)) for launch, r in zip(compiled.launches, resources)]
    widths = [max(len(row[i]) for row in rows) for i in range(5)]
    return "\n".join("  ".join(cell.ljust(w) if i == 1 else cell.rjust(w) for i, (cell, w) in
                               enumerate(zip(row, widths))).rstrip() for row in rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m conjugate.compiler.offline",
                                     description="Compile a plan's kernels for an NVIDIA GPU without one and "
                                                 "report each launch's registers, spills and shared memory.")
    parser.add_argument("plan", help="plan JSON file")
    parser.add_argument("--workload", required=True, help="workload TOML file")
    parser.add_argument("--arch", type=int, default=90, help="compute capability, e.g. 90 for Hopper (sm_90a)")
    args = parser.parse_args(argv)
    if "triton" in sys.modules and os.environ.get("TRITON_INTERPRET") == "1":
        print("error: triton was imported in interpreter mode (TRITON_INTERPRET=1); run this in a process "
              "started with TRITON_INTERPRET=0", file=sys.stderr)
        return 2
    os.environ["TRITON_INTERPRET"] = "0"  # before the first import of triton and of conjugate.compiler.tile

    from conjugate.compiler.round import compile_round
    from conjugate.compiler.feedback import CompileError
    from conjugate.errors import ConjugateError
    from conjugate.models.weights import meta_weights
    from conjugate.plan import load_plan
    from conjugate.workload import load_workload

    try:
        plan, workload = load_plan(args.plan), load_workload(args.workload)
        with tempfile.TemporaryDirectory() as tmp:
            compiled = compile_round(plan, workload, meta_weights(workload.draft, workload.torch_dtype),
                                     meta_weights(workload.target, workload.torch_dtype), cache_dir=Path(tmp))
            resources = compile_resources(compiled, args.arch)
    except CompileError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except ConjugateError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    kernels = len({launch.digest for launch in compiled.launches})
    print(f"{plan.name} on {workload.name}: {len(compiled.launches)} launches, {kernels} distinct kernels compiled "
          f"for sm_{args.arch}")
    print(_table(compiled, resources))
    return 0


if __name__ == "__main__":
    sys.exit(main())
