"""The LLM proposer (llm.py), its prompts (prompt.py), the boundary every reply passes (wire.py) and
its clients over the anthropic and openai SDKs (anthropic.py, openai.py)."""
from conjugate.agents.llm.llm import DEFAULT_TIMEOUT_S, LLMBudgetExceeded, LLMProposer

__all__ = ["DEFAULT_TIMEOUT_S", "LLMBudgetExceeded", "LLMProposer"]
