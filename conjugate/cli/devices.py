"""What a command asks of this machine's devices, refused in one line before any work."""
from __future__ import annotations

from conjugate.evaluate.evaluators import EvaluatorProfile, ProfileError


def require_device(profile: EvaluatorProfile) -> None:
    """A profile that measures on a GPU (kind gpu) where this machine has no CUDA device: every
    evaluation would fail alike."""
    import torch

    if profile.kind == "gpu" and not torch.cuda.is_available():
        raise ProfileError(f"{profile.source}: kind 'gpu' measures on a GPU and this machine has no CUDA device; "
                           "use --evaluator analytical")
