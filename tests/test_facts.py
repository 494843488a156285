"""Measured facts with provenance: the shipped file, what the heuristic reads from it, which GPU's
facts the prompt shows, bad files."""
from __future__ import annotations

import ast
import subprocess
from pathlib import Path

import pytest

import conjugate.agents
from conjugate.agents.base import NodeContext
from conjugate.agents.facts import (MAX_FACT_CHARS, PAPER_MECHANISMS, PROVENANCE, facts_for, figure, load_facts,
                                    shipped_facts)
from conjugate.agents.llm.prompt import Prompts
from conjugate.errors import ConjugateError
from conjugate.paths import shipped_plan
from conjugate.plan import load_plan

AGENTS_DIR = Path(conjugate.agents.__file__).parent
REPO = Path(__file__).resolve().parents[1]


def test_every_fact_has_its_provenance():
    for fact in load_facts():
        assert all(getattr(fact, field).strip() for field in PROVENANCE), fact.id
        assert len(fact.commit) >= 7 and all(c in "0123456789abcdef" for c in fact.commit), fact.id
        assert not fact.result or _result_found(fact), fact.id


def _result_found(fact) -> bool:
    """A fact's result file is in the tree, or (left the tree: git history is its archive) at its commit."""
    path = f"benchmarks/results/{fact.result}"
    if (REPO / path).exists():
        return True
    if not (REPO / ".git").exists():
        pytest.skip("not a git checkout: results that left the tree cannot be looked up")
    return subprocess.run(["git", "cat-file", "-e", f"{fact.commit}:{path}"], cwd=REPO, capture_output=True).returncode == 0


def test_every_knob_the_facts_list_has_a_measured_win_or_is_a_paper_mechanism():
    facts = load_facts()
    knobs = {f.knob for f in facts} - {"search"}
    won = {f.knob for f in facts if f.effect == "win"}
    assert knobs <= won | set(PAPER_MECHANISMS), knobs - won


def test_every_knob_of_a_model_block_has_a_measured_win():
    """The per-model knobs of the plan schema entered it with a win recorded in the facts."""
    from conjugate.plan.schema import MODEL_BLOCK

    won = {f.knob for f in load_facts() if f.effect == "win"}
    families = {{"stream": "streams"}.get(key, key) for key in MODEL_BLOCK.fields}
    assert families <= won, families - won


def _fact_ids_read(module: Path) -> set[str]:
    """The ids a module passes to figure() or sentence(), and the fact ids its constants name."""
    ids = set()
    for node in ast.walk(ast.parse(module.read_text())):
        if isinstance(node, ast.Call) and getattr(node.func, "id", "") in ("figure", "sentence"):
            ids |= {a.value for a in node.args if isinstance(a, ast.Constant)}
    return ids


def test_the_heuristic_reads_its_measured_figures_from_the_facts():
    read = set().union(*(_fact_ids_read(m) for m in (AGENTS_DIR / "heuristic").glob("*.py")))
    assert read and read <= set(shipped_facts())  # every figure it reads is a recorded fact
    assert figure("sms_balanced") < figure("sms_wide")  # the rules need them in this order


def test_the_heuristic_holds_no_measured_figure_of_its_own():
    """No module-level float constant in the heuristic but its ranking's own (not a measurement):
    measured numbers come from the facts."""
    ranking = {"_DECAY"}
    for module in (AGENTS_DIR / "heuristic").glob("*.py"):
        for node in ast.parse(module.read_text()).body:
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) and \
                    ast.unparse(node.targets[0]) not in ranking:
                assert not isinstance(node.value.value, float), (module.name, ast.unparse(node))


def test_the_shipped_facts_match_their_gpu():
    facts = load_facts()
    h200 = facts_for("NVIDIA H200", facts)
    assert len(h200) >= 5 and all(f.gpu == "H200" and f.says for f in h200)
    assert facts_for("nvidia h200 nvl", facts) == h200  # any name holding it, in any case
    assert facts_for("NVIDIA A100-SXM4-80GB", facts) == () and facts_for("", facts) == ()
    assert facts_for("NVIDIA H20", facts) == ()  # whole words: an H20 is not an H200


def _context(device: str) -> NodeContext:
    plan = load_plan(shipped_plan("streams"))
    return NodeContext(plan=plan.to_dict(), plan_hash=plan.hash, workload={"name": "tiny"}, evaluator="h200",
                       device=device, sms=132)


def test_the_expand_prompt_shows_the_facts_of_its_gpu_only():
    prompts = Prompts()
    some = facts_for("NVIDIA H200", load_facts())[0].says
    assert some in prompts.expand_text(_context("NVIDIA H200"), 3)
    other = prompts.expand_text(_context("NVIDIA L40S"), 3)
    assert some not in other and "NVIDIA L40S" in other


ENTRY = "[[fact]]\nid = 'a'\nknob = 'pdl'\neffect = 'win'\ngpu = 'H200'\ndate = 'd'\ncommit = 'abc1234'\nhow = 'x'\n"


@pytest.mark.parametrize("text, field", [
    (ENTRY.replace("how = 'x'\n", ""), "how"),
    (ENTRY.replace("commit = 'abc1234'", "commit = ''"), "commit"),
    (ENTRY + "seen = 1\n", "seen"),
    (ENTRY.replace("'pdl'", "'persist'"), "knob"),
    (ENTRY.replace("'win'", "'maybe'"), "effect"),
    (ENTRY + "value = 'high'\n", "value"),
    (ENTRY + f"says = '{'x' * (MAX_FACT_CHARS + 1)}'\n", "says"),
    (ENTRY + ENTRY, "a"),  # an id used twice
    ("gpu = 3\n", "gpu"),
])
def test_a_bad_facts_file_names_the_file_and_field(tmp_path, text, field):
    path = tmp_path / "facts.toml"
    path.write_text(text)
    with pytest.raises(ConjugateError) as info:
        load_facts(path)
    assert str(path) in str(info.value) and field in str(info.value), str(info.value)
    with pytest.raises(ConjugateError):
        Prompts(facts_file=path)  # an agent with a broken facts file does not start


def test_a_facts_file_that_does_not_parse_is_an_error(tmp_path):
    path = tmp_path / "facts.toml"
    path.write_text("[[fact]\n")
    with pytest.raises(ConjugateError, match=str(path)):
        load_facts(path)
