"""Serving: greedy speculative decoding with a plan's compiled round (`conjugate generate`)."""
from conjugate.serving.decoder import GenerationError, GenerationResult, SpeculativeDecoder

__all__ = ["GenerationError", "GenerationResult", "SpeculativeDecoder"]
