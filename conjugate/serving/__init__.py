"""Serving: speculative decoding with a plan's compiled round. `SpeculativeDecoder` compiles it,
`Engine` runs requests through it with continuous batching, `generate` decodes a batch of prompts."""
from conjugate.serving.decoder import GenerationError, SpeculativeDecoder
from conjugate.serving.engine import Engine
from conjugate.serving.generation import GenerationResult, generate
from conjugate.serving.requests import Finished, Request, RequestError, SamplingParams, Tokens

__all__ = ["Engine", "Finished", "GenerationError", "GenerationResult", "Request", "RequestError", "SamplingParams",
           "SpeculativeDecoder", "Tokens", "generate"]
