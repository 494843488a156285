"""What an evaluator profile decides of a search's settings."""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from conjugate.evaluate.evaluators import EvaluatorProfile
from conjugate.search.settings import SearchSettings


def scored_by(settings: SearchSettings, profile: EvaluatorProfile) -> SearchSettings:
    """The settings with what the evaluator profile decides: its file, and when a claim is stale."""
    return replace(settings, stale_after_s=2 * profile.time_limit_s,
                   evaluator_profile=str(Path(profile.source).resolve()))
