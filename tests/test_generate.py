"""`conjugate generate`: speculative decoding with a compiled round is lossless (its tokens are the
target's own greedy decoding, here transformers' `generate` on checkpoints transformers wrote), in
both modes, with ragged batches; acceptance; and bad input refused in one line."""
from __future__ import annotations

import json
import re
import warnings
from pathlib import Path

import pytest
import torch

from conjugate.cli import main
from conjugate.serving.accept import accept, append_emitted

transformers = pytest.importorskip("transformers")
from test_reference_hf import FAMILIES, _make_model, _save  # noqa: E402
from test_round import ROOT, SMALL_TILES  # noqa: E402

PROMPTS = {"simple": [[5, 17, 3], [9, 200, 41, 7, 7, 1]], "pipelined": [[3], [250, 4, 4, 90], [11, 12, 13, 14, 15, 16]]}
NEW = 4
LAYERS = 1  # the interpreter's time grows with every launch


# ---------------------------------------------------------------------------------------------
# acceptance, on tensors


def test_accept_keeps_the_agreeing_prefix_and_the_targets_next_token():
    drafts = torch.tensor([[5, 6, 7], [1, 2, 3], [9, 9, 9], [4, 8, 8]])
    target = torch.tensor([[5, 6, 7, 8], [1, 4, 3, 0], [2, 2, 2, 2], [4, 8, 1, 1]])
    got = accept(drafts, target)
    assert got.drafts_accepted.tolist() == [3, 1, 0, 2]
    assert got.counts.tolist() == [3, 2, 1, 3]  # all k accepted: t_k waits for the next round
    assert got.last.tolist() == [7, 4, 2, 1]
    out, produced = torch.full((4, 7), -1), torch.tensor([0, 2, 5, 1])
    append_emitted(out, produced, got)
    assert out[:, :-1].tolist() == [[5, 6, 7, -1, -1, -1], [-1, -1, 1, 4, -1, -1], [-1, -1, -1, -1, -1, 2],
                                    [-1, 4, 8, 1, -1, -1]]  # the last column is scratch
    assert produced.tolist() == [3, 4, 6, 4]


# ---------------------------------------------------------------------------------------------
# lossless against transformers


@torch.no_grad()
def _perturbed(model, seed: int):
    """A draft that agrees with the target often but not always: its weights plus noise."""
    draft = _make_model(_family_of(model), seed=0, layers=LAYERS)
    draft.load_state_dict(model.state_dict())
    gen = torch.Generator().manual_seed(seed)
    for p in draft.parameters():
        p.add_(torch.randn(p.shape, generator=gen) * 0.15 * p.float().std().clamp_min(1e-3))
    return draft


def _family_of(model) -> str:
    return {"LlamaForCausalLM": "llama", "Qwen2ForCausalLM": "qwen2", "Qwen3ForCausalLM": "qwen3"}[type(model).__name__]


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """family -> (workload file, HF target model)."""
    made = {}

    def get(family: str):
        if family not in made:
            root = tmp_path_factory.mktemp(f"gen-{family}")
            target = _make_model(family, seed=7 + FAMILIES.index(family), layers=LAYERS)
            _save(target, root / "target")
            _save(_perturbed(target, 3), root / "draft")
            made[family] = _workload(root, "draft", "target"), target
        return made[family]

    return get


@pytest.fixture(scope="module")
def small_tiled(tmp_path_factory):
    """Plan name -> a file of that shipped plan with test_round's small tiles (the shipped GPU tiles make
    the interpreter slow; these still split K and KV)."""
    root = tmp_path_factory.mktemp("plans")
    for name in ("streams", "interleave"):
        plan = json.loads((ROOT / "plans" / f"{name}.json").read_text())
        for model in ("draft", "target"):
            plan[model]["tiles"] = SMALL_TILES[model]
        (root / f"{name}.json").write_text(json.dumps(plan))
    return lambda name: str(root / f"{name}.json")


def _workload(root, draft: str, target: str, **fields) -> str:
    values = dict(k=2, draft_batch=2, target_batch=2, context=16, dtype="fp32", seed=0) | fields
    text = f'draft = "{draft}"\ntarget = "{target}"\n' + "".join(
        f"{key} = {json.dumps(value)}\n" for key, value in values.items())
    path = root / "generate.toml"
    path.write_text(text)
    return str(path)


@torch.no_grad()
def _hf_greedy(model, prompt: list[int], new: int) -> list[int]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = model.generate(torch.tensor([prompt]), max_new_tokens=new, min_new_tokens=new, do_sample=False,
                             eos_token_id=None, pad_token_id=0)
    return out[0, len(prompt):].tolist()


def _generate(workload: str | list[str], mode: str, prompts: list[list[int]], tmp_path, *extra: str,
              new: int = NEW, eos: bool = False) -> dict:
    """Run `conjugate generate` on a workload file (or the flags naming a pair) and read its JSON;
    past end-of-sequence ids unless `eos` (as `_hf_greedy` decodes)."""
    pair = [workload] if isinstance(workload, str) else workload
    args = ["generate", *pair, "--mode", mode, "--max-new-tokens", str(new), "--json", str(tmp_path / "g.json")]
    args += [] if eos else ["--ignore-eos"]
    for p in prompts:
        args += ["--prompt-ids", ",".join(map(str, p))]
    assert main(args + list(extra)) == 0
    return json.loads((tmp_path / "g.json").read_text())


# every family in the pipelined mode (the one a server runs), the simple mode once
@pytest.mark.parametrize("family, mode", [(family, "pipelined") for family in FAMILIES] + [(FAMILIES[0], "simple")])
def test_generate_equals_transformers_greedy(pair, small_tiled, family, mode, tmp_path):
    workload, target = pair(family)
    plan = "interleave" if mode == "pipelined" else "streams"
    result = _generate(workload, mode, PROMPTS[mode], tmp_path, "--plan", small_tiled(plan))
    assert result["plan"] == plan
    for entry, prompt in zip(result["outputs"], PROMPTS[mode]):
        assert entry["prompt_ids"] == prompt
        assert entry["generated_ids"] == _hf_greedy(target, prompt, NEW), (family, mode, prompt)
    assert len(result["outputs"]) == len(PROMPTS[mode])
    assert result["drafts_proposed"] > 0 and 0 <= result["drafts_accepted"] <= result["drafts_proposed"]
    assert result["rounds"] >= NEW // 2 and result["tokens"] == NEW * len(PROMPTS[mode])


@pytest.mark.parametrize("mode,backend,variants", [("simple", "conventional", "eager-sdpa/eager-grouped"),
                                                   ("pipelined", "conventional", "eager-grouped/eager-sdpa"),
                                                   ("pipelined", "conventional-streams", "eager-sdpa/eager-sdpa")])
def test_the_conventional_backends_equal_transformers_greedy(pair, mode, backend, variants, tmp_path):
    """torch's own execution of both models in the same loop: ragged prompts, lossless."""
    workload, target = pair("qwen3")
    result = _generate(workload, mode, PROMPTS[mode], tmp_path, "--plan", backend, "--variants", variants)
    assert result["plan"] == backend
    for entry, prompt in zip(result["outputs"], PROMPTS[mode]):
        assert entry["generated_ids"] == _hf_greedy(target, prompt, NEW), (mode, backend, prompt)


def test_a_pair_given_by_flags_is_sized_for_its_prompts(pair, small_tiled, tmp_path):
    """No workload file: --draft/--target, with k and dtype flags; batch and KV capacity from the prompts."""
    workload, target = pair("llama")
    checkpoints = Path(workload).parent
    prompts = [[5, 17, 3], [9, 200, 41, 7, 7, 1], [8]]
    flags = ["--draft", str(checkpoints / "draft"), "--target", str(checkpoints / "target"), "--k", "3",
             "--dtype", "fp32"]
    result = _generate(flags, "simple", prompts, tmp_path, "--plan", small_tiled("streams"), new=5)
    for entry, prompt in zip(result["outputs"], prompts):
        assert entry["generated_ids"] == _hf_greedy(target, prompt, 5)
    assert result["workload"] == "draft-target"


def test_a_draft_identical_to_the_target_accepts_every_token(small_tiled, tmp_path, capsys):
    workload = _workload(tmp_path, "tiny-llama-d", "tiny-llama-d", k=3, context=24)
    result = _generate(workload, "simple", [[1, 2, 3], [4]], tmp_path, "--plan", small_tiled("streams"))
    assert result["drafts_accepted"] == result["drafts_proposed"] > 0
    assert result["acceptance"] == 1.0
    assert result["rounds"] == -(-NEW // 3)  # k tokens a round
    summary = capsys.readouterr().out.splitlines()[-1]
    from conjugate.compiler.tile import INTERPRETING

    if INTERPRETING:  # the time measures the interpreter: no tokens/s is printed
        assert "tokens/s" not in summary and "interpreter" in summary
    else:
        assert float(re.search(r"([\d.e+-]+) tokens/s", summary).group(1)) > 0


def test_generation_ends_at_the_checkpoints_end_of_sequence_id(pair, tmp_path):
    """The target's generation_config.json names an id the target emits: each sequence ends with it,
    as transformers' generate ends there; more prompts than slots take the slots in turn."""
    import shutil

    workload, target = pair("qwen2")
    prompts = PROMPTS["pipelined"] + [[9, 200, 41, 7]]
    eos = _hf_greedy(target, prompts[-1], NEW)[1]
    for role in ("draft", "target"):
        shutil.copytree(Path(workload).parent / role, tmp_path / role)
    (tmp_path / "target" / "generation_config.json").write_text(json.dumps({"eos_token_id": [eos]}))
    result = _generate(_workload(tmp_path, "draft", "target", draft_batch=1, target_batch=1), "pipelined", prompts,
                       tmp_path, "--plan", "conventional", "--variants", "eager-sdpa/eager-sdpa", eos=True)
    for entry, prompt in zip(result["outputs"], prompts):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            hf = target.generate(torch.tensor([prompt]), max_new_tokens=NEW, do_sample=False, eos_token_id=eos,
                                 pad_token_id=0)[0, len(prompt):].tolist()
        ended = eos in hf
        assert entry["generated_ids"] == (hf[:hf.index(eos) + 1] if ended else hf), prompt
        assert entry["finish"] == ("stop" if ended else "length")
    assert result["outputs"][-1]["finish"] == "stop"


def test_sampled_generation_is_fixed_by_its_seed(pair, tmp_path):
    workload, _ = pair("qwen3")
    flags = ["--plan", "conventional", "--variants", "eager-sdpa/eager-sdpa", "--temperature", "1"]
    runs = [_generate(workload, "simple", PROMPTS["simple"], tmp_path, *flags, "--seed", seed, new=4)["outputs"]
            for seed in ("3", "3", "4")]
    assert runs[0] == runs[1] != runs[2]
    assert all(len(o["generated_ids"]) == 4 for o in runs[0])


# ---------------------------------------------------------------------------------------------
# bad input: one line, exit 2, before any work


def _refused(capsys, args: list[str], *needles: str) -> None:
    capsys.readouterr()  # what the test printed itself (transformers' progress bars)
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("error: ")
    for needle in needles:
        assert needle in err, err


def test_bad_prompts_are_refused(tmp_path, capsys):
    workload = _workload(tmp_path, "tiny-llama-d", "tiny-llama-t", context=12)
    _refused(capsys, ["generate", workload, "--prompt-ids", ""], "prompt 0", "empty")
    _refused(capsys, ["generate", workload, "--prompt-ids", "1,2,3,4,5,6,7,8,9", "--max-new-tokens", "4"],
             "prompt 0", "KV capacity", "context is 12")
    _refused(capsys, ["generate", workload, "--prompt-ids", "1,99999"], "token ids")
    _refused(capsys, ["generate", workload, "--prompt", "hello"], "tokenizer", "--prompt-ids")
    _refused(capsys, ["generate", workload], "no prompts")
    _refused(capsys, ["generate", workload, "--prompt-ids", "1", "--temperature", "nan"], "--temperature")
    _refused(capsys, ["generate", workload, "--prompt-ids", "1", "--top-p", "0"], "--top-p")
    _refused(capsys, ["generate", "--prompt-ids", "1"], "no model pair", "--draft and --target")
    _refused(capsys, ["generate", workload, "--prompt-ids", "1", "--plan", "conventional", "--variants", "fast"],
             "--variants", "conventional variant 'fast'")
    _refused(capsys, ["generate", workload, "--prompt-ids", "1", "--plan", "conventional-streams", "--mode", "simple",
                      "--max-new-tokens", "2"],
             "--mode pipelined")


def test_unservable_checkpoint_pairs_are_refused_when_the_workload_loads(tmp_path, capsys):
    tokenizers = pytest.importorskip("tokenizers")
    target = _make_model("llama", seed=1)
    for name, vocab in (("a", {"x": 0, "y": 1}), ("b", {"x": 0, "z": 1})):
        _save(target, tmp_path / name)
        tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="x"))
        tok.save(str(tmp_path / name / "tokenizer.json"))
    _refused(capsys, ["generate", _workload(tmp_path, "a", "b"), "--prompt-ids", "1"], "different tokenizers")

    config = target.config
    config.vocab_size += 16  # a draft that can propose tokens the target cannot verify
    _save(transformers.LlamaForCausalLM(config), tmp_path / "big")
    _save(_make_model("llama", seed=1), tmp_path / "plain")
    _refused(capsys, ["generate", _workload(tmp_path, "big", "plain"), "--prompt-ids", "1"], "field 'draft'",
             "larger than the target's")

    odd = _make_model("qwen3", seed=1)  # head_dim 32 -> 24: not a power of two
    config = odd.config
    config.head_dim = 24
    _save(transformers.Qwen3ForCausalLM(config), tmp_path / "odd")
    _refused(capsys, ["generate", _workload(tmp_path, "odd", "odd"), "--prompt-ids", "1"], "head_dim 24")


def test_text_prompts_use_the_checkpoints_tokenizer(tmp_path):
    tokenizers = pytest.importorskip("tokenizers")
    target = _make_model("qwen2", seed=5, layers=LAYERS)
    _save(target, tmp_path / "t")
    words = {w: i for i, w in enumerate("<unk> the cat sat on a mat".split())}
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(words, unk_token="<unk>"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    tok.save(str(tmp_path / "t" / "tokenizer.json"))
    result = _generate(_workload(tmp_path, "t", "t"), "simple", [], tmp_path, "--prompt", "the cat sat")
    assert result["outputs"][0]["prompt_ids"] == [1, 2, 3]
    assert result["outputs"][0]["generated_ids"] == _hf_greedy(target, [1, 2, 3], NEW)


def test_the_best_plan_of_a_search_database_generates(tmp_path):
    """--db: the latest run's fastest plan; the output is still the target's greedy decoding."""
    from conjugate.paths import DEFAULT_WORKLOAD

    db, unchecked = tmp_path / "s.db", tmp_path / "analytical.toml"
    shipped = (ROOT / "evaluators" / "analytical.toml").read_text()
    unchecked.write_text(re.sub(r"(?m)^max_params = .*$", "max_params = 0", shipped))  # modeled only: quick
    assert main(["search", str(DEFAULT_WORKLOAD), "--budget", "2", "--db", str(db), "--evaluator", str(unchecked)]) == 0
    result = _generate(str(DEFAULT_WORKLOAD), "simple", [[1, 2]], tmp_path, "--db", str(db), new=1)
    assert "-node" in result["plan"]
    # the target's greedy decoding by torch's own execution (lossless against transformers, above)
    eager = _generate(str(DEFAULT_WORKLOAD), "simple", [[1, 2]], tmp_path, "--plan", "conventional", "--variants",
                      "eager-sdpa/eager-sdpa", new=1)
    assert result["outputs"] == eager["outputs"]


# ---------------------------------------------------------------------------------------------
# the figures it prints


def test_a_slow_rate_is_printed_in_significant_figures_not_as_zero():
    from conjugate.cli.generate import _speed

    rate = re.search(r"([\d.e+-]+) tokens/s", _speed(3, 1000.0, interpreted=False))
    assert rate and float(rate.group(1)) == pytest.approx(0.003)
