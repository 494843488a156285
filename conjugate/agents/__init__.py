"""Proposers: what suggests the next plan edits to the search.

    heuristic          rule-based edits per knob family, driven by the node's result (agents/heuristic/)
    random, greedy     the search's baselines: random edits of random nodes, hill-climbing (agents/search_baselines.py)
    replay             the edits of a recorded run, in their order (agents/replay.py)
    anthropic:<model>  a Claude model through the anthropic SDK (key: ANTHROPIC_API_KEY)
    openai:<model>     an OpenAI model, or any OpenAI-compatible server given its base URL
                       (key: OPENAI_API_KEY; optional with a base URL)

`make_proposer(spec)` builds one from its command-line spec; base.py holds the interface. Every LLM
reply passes one boundary (agents/llm/wire.py, then agents/llm/prompt.py) before any of it is used.
"""
from __future__ import annotations

from conjugate.agents.base import EDIT_KINDS, LLMCallLog, NodeContext, Proposal, Proposer, ProposerUnavailable
from conjugate.errors import ConjugateError

__all__ = ["EDIT_KINDS", "NodeContext", "Proposal", "Proposer", "ProposerUnavailable", "make_proposer"]
_FORMS = "heuristic, random, greedy, replay, anthropic:<model> or openai:<model>"


def make_proposer(spec: str, *, seed: int = 0, base_url: str | None = None, log_call: LLMCallLog | None = None,
                  max_cost_usd: float | None = None, spent_usd: float = 0.0,
                  replay_records: list[dict] | None = None, timeout_s: float | None = None) -> Proposer:
    """The proposer a spec names; ConjugateError (one line) for an unknown spec or a missing key.
    `timeout_s`: an LLM request's timeout (default DEFAULT_TIMEOUT_S)."""
    if spec == "heuristic":
        from conjugate.agents.heuristic import HeuristicProposer
        return HeuristicProposer(seed=seed)
    if spec in ("random", "greedy"):
        from conjugate.agents.search_baselines import GreedyProposer, RandomProposer
        return (RandomProposer if spec == "random" else GreedyProposer)(seed=seed)
    if spec == "replay":
        if not replay_records:
            raise ConjugateError("--agent replay: no recorded edits to replay")
        from conjugate.agents.replay import ReplayProposer
        return ReplayProposer(replay_records)
    provider, _, model = spec.partition(":")
    if provider not in ("anthropic", "openai") or not model.strip():
        raise ConjugateError(f"--agent: unknown agent {spec!r}; use {_FORMS}")
    from conjugate.agents.llm import DEFAULT_TIMEOUT_S, LLMProposer
    if provider == "anthropic":
        from conjugate.agents.llm.anthropic import AnthropicClient as Client
    else:
        from conjugate.agents.llm.openai import OpenAIClient as Client
    client = Client(model, base_url=base_url, timeout_s=timeout_s or DEFAULT_TIMEOUT_S)
    return LLMProposer(client, provider, model, log_call=log_call, max_cost_usd=max_cost_usd, spent_usd=spent_usd)
