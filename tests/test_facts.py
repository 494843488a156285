"""Measured facts per GPU model for the LLM prompt: the shipped file, matching a device, bad files."""
from __future__ import annotations

import pytest

from conjugate.agents.base import NodeContext
from conjugate.agents.facts import MAX_FACT_CHARS, facts_for, load_facts
from conjugate.agents.prompt import Prompts
from conjugate.errors import ConjugateError
from conjugate.paths import shipped_plan
from conjugate.plan import load_plan


def test_the_shipped_facts_load_and_match_their_gpu():
    facts = load_facts()
    h200 = facts_for("NVIDIA H200", facts)
    assert h200 is not None and h200.device == "H200" and len(h200.facts) >= 5
    assert facts_for("nvidia h200 nvl", facts) is h200  # any name holding it, in any case
    assert facts_for("NVIDIA A100-SXM4-80GB", facts) is None and facts_for("", facts) is None
    assert facts_for("NVIDIA H20", facts) is None  # whole words: an H20 is not an H200


def _context(device: str) -> NodeContext:
    plan = load_plan(shipped_plan("streams"))
    return NodeContext(plan=plan.to_dict(), plan_hash=plan.hash, workload={"name": "tiny"}, evaluator="h200",
                       device=device, sms=132)


def test_the_expand_prompt_shows_the_facts_of_its_gpu_only():
    prompts = Prompts()
    shown = prompts.expand_text(_context("NVIDIA H200"), 3)
    h200 = next(g for g in load_facts() if g.device == "H200")
    assert f"H200, {h200.date} (benchmarks/README.md" in shown and "- Two streams beat shared launches" in shown
    other = prompts.expand_text(_context("NVIDIA L40S"), 3)
    assert "none recorded for NVIDIA L40S" in other and "Two streams beat" not in other


@pytest.mark.parametrize("text, expected", [
    ("[[gpu]]\ndevice = 'H200'\ndate = 'd'\nsource = 's'\n", "gpu[0]: field 'facts' should be a non-empty list"),
    ("[[gpu]]\ndevice = ''\ndate = 'd'\nsource = 's'\nfacts = ['a']\n", "gpu[0]: field 'device' should be a non-empty"),
    ("[[gpu]]\ndevice = 'H200'\ndate = 'd'\nsource = 's'\nfacts = ['a']\nseen = 1\n", "gpu[0]: unknown field 'seen'"),
    ("[[gpu]]\ndevice = 'H200'\ndate = 'd'\nsource = 's'\nfacts = [1]\n", "field 'facts' should be a non-empty list"),
    (f"[[gpu]]\ndevice = 'H200'\ndate = 'd'\nsource = 's'\nfacts = ['{'x' * (MAX_FACT_CHARS + 1)}']\n",
     "at most 12 sentences of at most 300 characters"),
    ("gpu = 3\n", "expected only [[gpu]] tables"),
    ("[[gpu]\n", "malformed TOML"),
])
def test_a_bad_facts_file_names_the_file_and_field(tmp_path, text, expected):
    path = tmp_path / "facts.toml"
    path.write_text(text)
    with pytest.raises(ConjugateError) as info:
        load_facts(path)
    assert str(path) in str(info.value) and expected in str(info.value), str(info.value)
    with pytest.raises(ConjugateError):
        Prompts(facts_file=path)  # an agent with a broken facts file does not start
