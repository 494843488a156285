"""Typed errors. Everything the project raises on purpose derives from ConjugateError (the compiler's
CompileError lives with the failure data it carries, in compiler/feedback.py)."""
from __future__ import annotations


class ConjugateError(Exception):
    """Root of the project's errors; its message is one line meant for the user."""


class WorkloadError(ConjugateError):
    """A workload file is malformed or names something that cannot be used."""


class CheckpointError(ConjugateError):
    """A model checkpoint (config.json, safetensors) is missing, malformed or mismatched."""


class PlanError(ConjugateError):
    """A plan failed validation; `errors` holds every problem as 'PATH: reason'."""

    def __init__(self, errors: list[str] | str, source: str | None = None):
        self.errors = [errors] if isinstance(errors, str) else list(errors)
        self.source = source
        shown = "; ".join(self.errors[:5]) or "invalid plan"
        more = f" (+{len(self.errors) - 5} more)" if len(self.errors) > 5 else ""
        super().__init__(f"{source}: {shown}{more}" if source else f"{shown}{more}")


class PatchError(ConjugateError):
    """A JSON-Patch edit could not be applied."""


class ScheduleError(ConjugateError):
    """A plan expanded to a schedule that breaks a dependency or cannot be honoured. `errors` holds the
    problem as 'PATH: reason' (or the ops it names), without the plan file the message starts with."""

    def __init__(self, error: str, source: str | None = None):
        self.errors = [error]
        self.source = source
        super().__init__(f"{source}: {error}" if source else error)

