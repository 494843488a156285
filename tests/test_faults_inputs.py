"""Bad input files through the real command line: each ends in exactly one `error: ` line on stderr that
names the file (and the field, where there is one), exit status 2, and no traceback.

FAULTS is the table: plans, workloads, evaluator profiles, checkpoints (config.json and the shard
index), search databases and measured-rounds files. Every case fails while its file is read, before
anything is compiled or evaluated; the one search that runs (every evaluation failing) is below it.
"""
from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shutil
import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pytest
import torch
from safetensors.torch import save_file

from conjugate.cli import main
from conjugate.search.store.schema import SCHEMA_VERSION as STORE_VERSION
from test_cli import EXAMPLES, INTERLEAVE, REPO, TINY, assert_one_line_error, run  # tests/test_cli.py

ANALYTICAL = (REPO / "evaluators" / "analytical.toml").read_text()
H200 = (REPO / "evaluators" / "h200.toml").read_text()
TINY_TEXT = TINY.read_text()
SCHEMA = "conjugate.plan/2"
SCHEMA_V1 = "conjugate.plan/1"  # converted on read
DROP = object()  # a key to leave out
CONFIG = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4,
          "num_key_value_heads": 2, "num_hidden_layers": 2, "vocab_size": 200, "rms_norm_eps": 1e-5,
          "rope_theta": 500000.0, "tie_word_embeddings": True}
LLAMA3_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 64}
HUGE_INT = "9" * 5000  # past the interpreter's 4300-digit limit on reading an integer


@dataclass(frozen=True)
class Fault:
    id: str
    kind: str  # the reader it reaches: plan, workload, profile, config, index, measured, and a database
    # through show (database), export or search --resume
    bad: str | bytes | Callable  # the file's content, or what writes it: f(path) or, for databases, f(path, run_db)
    fragments: tuple[str, ...]  # what the line names besides the file: the field, the reason


def F(id: str, kind: str, bad, *fragments: str) -> Fault:
    return Fault(id, kind, bad, fragments)


# -- file builders -----------------------------------------------------------------------------

def plan(**fields) -> str:
    return json.dumps({"schema": SCHEMA, **fields})


def cross(**fields) -> str:
    """A plan whose cross-model block holds these fields."""
    return plan(cross=fields)


def model(which: str, **fields) -> str:
    """A plan whose `which` model block (draft or target) holds these fields."""
    return plan(**{which: fields})


def v1(**fields) -> str:
    return json.dumps({"schema": SCHEMA_V1, **fields})


def nested(depth: int, leaf: str = "1") -> str:
    return '{"a": ' * depth + leaf + "}" * depth


def toml_with(text: str, **values) -> str:
    """The TOML text with each `key = ...` line set to the raw value given (DROP removes it; a key
    not there yet is added at the top level)."""
    for key, raw in values.items():
        line = re.compile(rf"(?m)^{key}\s*=.*$")
        if raw is DROP:
            text = line.sub("", text)
        elif line.search(text):
            text = line.sub(lambda _: f"{key} = {raw}", text, count=1)
        else:
            text = f"{key} = {raw}\n" + text
    return text


def workload(**values) -> str:
    return toml_with(TINY_TEXT, **values)


def analytical(**values) -> str:
    return toml_with(ANALYTICAL, **values)


def h200(**values) -> str:
    return toml_with(H200, **values)


def section_as_value(text: str, name: str, end: str | None, value: str) -> str:
    """The profile with its table `[name]` (up to `end`, or to the end) replaced by `name = value`."""
    start = text.index(f"[{name}]")
    rest = text[:start] + (text[text.index(end, start):] if end else "")
    return rest.replace("time_limit_s", f"{name} = {value}\ntime_limit_s", 1)  # a top-level key


def config(**changes) -> str:
    return json.dumps({k: v for k, v in {**CONFIG, **changes}.items() if v is not DROP})


def rope(**changes) -> str:
    return config(rope_scaling={k: v for k, v in {**LLAMA3_ROPE, **changes}.items() if v is not DROP})


def index(weight_map) -> str:
    return json.dumps({"metadata": {}, "weight_map": weight_map})


def measured(median_ms=1.0, plan_name="sequential") -> str:
    return json.dumps({"workloads": [{"workload": "tiny", "plans": [{"plan": plan_name, "median_ms": median_ms}]}]})


def sqlite(script: str) -> Callable[[Path, Path], None]:
    def write(path: Path, run_db: Path) -> None:
        with contextlib.closing(sqlite3.connect(path)) as c:
            c.executescript(script)
    return write


def damaged(sql: str) -> Callable[[Path, Path], None]:
    """A copy of a real run's database with one statement applied."""
    def write(path: Path, run_db: Path) -> None:
        shutil.copy(run_db, path)
        with contextlib.closing(sqlite3.connect(path)) as c, c:
            c.execute(sql)
    return write


def directory(path: Path, *_) -> None:
    path.mkdir()


def missing(path: Path, *_) -> None:
    pass


def too_large(path: Path, *_) -> None:
    path.write_text(" " * (17 << 20))


FAULTS = [
    # -- plans: plan validate PLAN --workload tiny
    F("plan-malformed", "plan", '{"schema": "conjugate.plan/2", "name": }', "malformed JSON", "line 1"),
    F("plan-empty", "plan", "", "malformed JSON"),
    F("plan-bom", "plan", "\ufeff" + plan(), "malformed JSON"),
    F("plan-not-utf8", "plan", b"\xff\xfe{}", "not UTF-8"),
    F("plan-directory", "plan", directory, "is a directory"),
    F("plan-missing", "plan", missing, "no such plan file"),
    F("plan-too-large", "plan", too_large, "larger than 16 MiB"),
    F("plan-arrays-past-the-stack", "plan", "[" * 100_000 + "]" * 100_000, "nested deeper than 32 levels"),
    F("plan-objects-past-the-stack", "plan", nested(5000), "nested deeper than 32 levels"),
    F("plan-nested-40-levels", "plan", nested(40), "nested deeper than 32 levels"),
    F("plan-huge-integer", "plan", '{"schema": "conjugate.plan/2", "cross": {"launch": {"num_warps": ' + HUGE_INT
      + "}}}", "an integer of more than 4300 digits"),
    F("plan-unpaired-surrogate", "plan", '{"schema": "conjugate.plan/2", "name": "\\ud800"}', "surrogates"),
    F("plan-top-level-list", "plan", "[]", "$: should be an object, got a list"),
    F("plan-top-level-string", "plan", '"plan"', "$: should be an object"),
    F("plan-top-level-null", "plan", "null", "$: should be an object"),
    F("plan-schema-missing", "plan", "{}", "$.schema"),
    F("plan-schema-wrong", "plan", plan(schema="conjugate.plan/3"), "$.schema"),
    F("plan-unknown-key", "plan", plan(colour="blue"), "$.colour", "unknown key"),
    F("plan-unknown-key-with-line-break", "plan", plan(**{"a\nb": 1}), '$["a\\nb"]', "unknown key"),
    F("plan-unknown-key-very-long", "plan", plan(**{"k" * 10_000: 1}), "unknown key"),
    F("plan-v1-key-in-a-v2-plan", "plan", plan(alignment="greedy"), "$.alignment", "unknown key"),
    F("plan-name-number", "plan", plan(name=3), "$.name", "string"),
    F("plan-name-escape", "plan", plan(name="\x1b]0;pwned\x07"), "$.name", "printable", "\\u001b"),
    F("plan-name-newline", "plan", plan(name="a\nb"), "$.name", "printable"),
    F("plan-name-huge", "plan", plan(name="p" * 201), "$.name", "1 to 200"),
    F("plan-key-twice", "plan", '{"schema": "conjugate.plan/2", "cross": {"alignment": "greedy", '
      '"alignment": "sequential"}}', '"alignment"', "twice"),
    F("plan-key-twice-nested", "plan", '{"schema": "conjugate.plan/2", "cross": {"launch": {"num_warps": 4, '
      '"num_warps": 8}}}', '"num_warps"', "twice"),
    F("plan-description-list", "plan", plan(description=["a"]), "$.description"),
    F("plan-cross-list", "plan", plan(cross=[]), "$.cross", "should be an object, got a list"),
    F("plan-cross-unknown-key", "plan", cross(persist={}), "$.cross.persist", "unknown key"),
    F("plan-alignment-list", "plan", cross(alignment=["greedy"]), "$.cross.alignment"),
    F("plan-alignment-unknown", "plan", cross(alignment="diagonal"), "$.cross.alignment"),
    F("plan-capture-boolean", "plan", cross(capture=True), "$.cross.capture"),
    F("plan-streams-two-with-greedy", "plan", cross(streams="two", alignment="greedy"), "$.cross.streams"),
    F("plan-layout-object", "plan", cross(operand_layout={"packed": True}), "$.cross.operand_layout"),
    F("plan-model-string", "plan", plan(target="big"), "$.target", "should be an object, got a string"),
    F("plan-model-unknown", "plan", plan(oracle={"tiles": {}}), "$.oracle", "unknown key"),
    F("plan-model-unknown-key", "plan", model("draft", persist={}), "$.draft.persist", "unknown key"),
    F("plan-tiles-list", "plan", model("target", tiles=[]), "$.target.tiles", "should be an object, got a list"),
    F("plan-tiles-kind-list", "plan", model("target", tiles={"qkv": [64]}), "$.target.tiles.qkv"),
    F("plan-tiles-unknown-kind", "plan", model("target", tiles={"conv": {}}), "$.target.tiles.conv", "unknown key"),
    F("plan-tile-nan", "plan", model("target", tiles={"qkv": {"BLOCK_N": float("nan")}}),
      "$.target.tiles.qkv.BLOCK_N", "nan"),
    F("plan-tile-minus-infinity", "plan", model("draft", tiles={"down": {"BLOCK_K": float("-inf")}}),
      "$.draft.tiles.down.BLOCK_K"),
    F("plan-tile-float-overflow", "plan", '{"schema": "conjugate.plan/2", "target": {"tiles": {"attn": '
      '{"SPLIT_KV": 1e400}}}}', "$.target.tiles.attn.SPLIT_KV"),
    F("plan-tile-power-of-two-past-range", "plan", model("target", tiles={"down": {"SPLIT_K": 2**100}}),
      "$.target.tiles.down.SPLIT_K", "out of range"),
    F("plan-tile-not-power-of-two", "plan", model("target", tiles={"qkv": {"BLOCK_N": 48}}),
      "$.target.tiles.qkv.BLOCK_N", "power of two"),
    F("plan-tile-string", "plan", model("draft", tiles={"down": {"SPLIT_K": "2"}}), "$.draft.tiles.down.SPLIT_K"),
    F("plan-tile-unknown-key", "plan", model("target", tiles={"attn": {"BLOCK_K": 64}}),
      "$.target.tiles.attn.BLOCK_K", "unknown key"),
    F("plan-reduce-unknown", "plan", model("draft", reduce="sum"), "$.draft.reduce"),
    F("plan-pdl-boolean", "plan", model("target", pdl=True), "$.target.pdl"),
    F("plan-pdl-v1-object", "plan", model("draft", pdl={"trigger": "end"}), "$.draft.pdl"),
    F("plan-stream-list", "plan", model("draft", stream=["high"]), "$.draft.stream"),
    F("plan-stream-priority-unknown", "plan", model("target", stream={"priority": "urgent"}),
      "$.target.stream.priority"),
    F("plan-stream-priority-on-one-stream", "plan", model("draft", stream={"priority": "high"}),
      "$.draft.stream.priority", "$.cross.streams"),
    F("plan-stream-sms-not-a-multiple-of-8", "plan", plan(draft={"stream": {"sms": 12}}, cross={"streams": "two"}),
      "$.draft.stream.sms", "multiple of 8"),
    F("plan-stream-sms-negative", "plan", plan(draft={"stream": {"sms": -8}}, cross={"streams": "two"}),
      "$.draft.stream.sms"),
    F("plan-stream-sms-both-models", "plan", plan(draft={"stream": {"sms": 16}}, target={"stream": {"sms": 16}},
                                                  cross={"streams": "two"}), "$.target.stream.sms", "at most one"),
    F("plan-launch-list", "plan", cross(launch=[4, 2]), "$.cross.launch"),
    F("plan-launch-warps-nan", "plan", cross(launch={"num_warps": float("nan")}), "$.cross.launch.num_warps"),
    F("plan-launch-warps-infinity", "plan", cross(launch={"num_warps": float("inf")}), "$.cross.launch.num_warps"),
    F("plan-launch-stages-float", "plan", cross(launch={"num_stages": 2.0}), "$.cross.launch.num_stages"),
    F("plan-launch-stages-zero", "plan", cross(launch={"num_stages": 0}), "$.cross.launch.num_stages",
      "out of range"),
    F("plan-launch-warps-negative", "plan", cross(launch={"num_warps": -4}), "$.cross.launch.num_warps"),
    F("plan-launch-warps-boolean", "plan", cross(launch={"num_warps": True}), "$.cross.launch.num_warps"),
    F("plan-pairs-list", "plan", cross(pairs=["qkv"]), "$.cross.pairs"),
    F("plan-pairs-kinds-string", "plan", cross(pairs={"qkv": "*"}), "$.cross.pairs.qkv"),
    F("plan-pairs-kind-object", "plan", cross(pairs={"qkv": [{"kind": "attn"}]}), "$.cross.pairs.qkv[0]"),
    F("plan-pairs-unknown-kind", "plan", cross(pairs={"qkv": ["conv"]}), "$.cross.pairs.qkv[0]"),
    F("plan-fusions-object", "plan", model("draft", fusions={"lm_head+argmax": True}), "$.draft.fusions",
      "should be a list"),
    F("plan-fusions-string", "plan", model("target", fusions="lm_head+argmax"), "$.target.fusions"),
    F("plan-fusion-unknown", "plan", model("target", fusions=["qkv+attn"]), "$.target.fusions[0]"),
    F("plan-interleave-list", "plan", cross(interleave=["ratio"]), "$.cross.interleave"),
    F("plan-interleave-pattern-unknown", "plan", cross(interleave={"pattern": "zigzag"}),
      "$.cross.interleave.pattern"),
    F("plan-ratio-three", "plan", cross(interleave={"pattern": "ratio", "ratio": [1, 2, 3]}),
      "$.cross.interleave.ratio"),
    F("plan-ratio-string", "plan", cross(interleave={"pattern": "ratio", "ratio": "1:2"}), "$.cross.interleave.ratio"),
    F("plan-ratio-infinity", "plan", cross(interleave={"pattern": "ratio", "ratio": [float("inf"), 1]}),
      "$.cross.interleave.ratio[0]"),
    F("plan-ratio-zero", "plan", cross(interleave={"pattern": "ratio", "ratio": [1, 0]}),
      "$.cross.interleave.ratio[1]"),
    F("plan-overrides-object", "plan", cross(overrides={"match": "t.*"}), "$.cross.overrides", "should be a list"),
    F("plan-override-list", "plan", cross(overrides=[["t.*"]]), "$.cross.overrides[0]"),
    F("plan-override-without-match", "plan", cross(overrides=[{"pair": False}]), "$.cross.overrides[0].match"),
    F("plan-override-match-number", "plan", cross(overrides=[{"match": 7}]), "$.cross.overrides[0].match"),
    F("plan-override-pair-string", "plan", cross(overrides=[{"match": "t.*", "pair": "no"}]),
      "$.cross.overrides[0].pair"),
    F("plan-override-with-list", "plan", cross(overrides=[{"match": "t.l0.qkv", "with": ["d.s0.l0.qkv"]}]),
      "$.cross.overrides[0].with"),
    F("plan-override-with-target-op", "plan", cross(overrides=[{"match": "t.l0.qkv", "with": "t.l1.qkv"}]),
      "$.cross.overrides[0].with", "draft op"),
    F("plan-override-tiles-list", "plan", cross(overrides=[{"match": "t.*", "tiles": []}]),
      "$.cross.overrides[0].tiles"),
    F("plan-override-tiles-unknown-model", "plan", cross(overrides=[{"match": "t.*", "tiles": {"oracle": {}}}]),
      "$.cross.overrides[0].tiles.oracle", "unknown key"),
    F("plan-override-launch-nan", "plan", cross(overrides=[{"match": "t.*", "launch": {"num_warps": float("nan")}}]),
      "$.cross.overrides[0].launch.num_warps"),
    F("plan-override-pdl-v1-object", "plan", cross(overrides=[{"match": "t.*", "pdl": {"trigger": "end"}}]),
      "$.cross.overrides[0].pdl"),
    F("plan-override-unknown-key", "plan", cross(overrides=[{"match": "t.*", "colour": 1}]),
      "$.cross.overrides[0].colour"),
    F("plan-pin-unknown-op", "plan", cross(alignment="greedy", overrides=[{"match": "t.l0.qkv",
                                                                           "with": "d.s9.l0.qkv"}]),
      "$.cross.overrides[0].with", "not a draft op"),
    F("plan-pin-into-three-launches", "plan", cross(alignment="greedy", overrides=[{"match": "t.l*.qkv",
                                                                                    "with": "d.s0.l0.qkv"}]),
      "$.cross.overrides[0].with", "exactly one target launch", "3"),
    F("plan-pin-into-no-launch", "plan", cross(alignment="greedy", overrides=[{"match": "t.nothing",
                                                                               "with": "d.s0.l0.qkv"}]),
      "$.cross.overrides[0].with", "selects 0"),
    F("plan-pin-one-op-twice", "plan", cross(alignment="greedy", overrides=[
        {"match": "t.l0.qkv", "with": "d.s0.l0.qkv"}, {"match": "t.l2.qkv", "with": "d.s0.l0.qkv"}]),
      "$.cross.overrides[1].with", "already pinned"),
    F("plan-pin-two-ops-one-launch", "plan", cross(alignment="greedy", overrides=[
        {"match": "t.l0.qkv", "with": "d.s0.l0.qkv"}, {"match": "t.l0.qkv", "with": "d.s0.l1.qkv"}]),
      "$.cross.overrides", "same target launch"),
    F("plan-pins-against-the-chain", "plan", cross(alignment="greedy", overrides=[
        {"match": "t.l0.qkv", "with": "d.s1.l0.qkv"}, {"match": "t.l2.qkv", "with": "d.s0.l0.qkv"}]),
      "d.s0.l0.qkv", "before its dependency"),
    # a conjugate.plan/1 plan is converted on read: a shape error names its v1 field, a value error the
    # field it became, a retired knob set away from its default is refused
    F("plan-v1-malformed", "plan", '{"schema": "conjugate.plan/1", "alignment": }', "malformed JSON"),
    F("plan-v1-unknown-key", "plan", v1(colour="blue"), "$.colour", "unknown key"),
    F("plan-v1-with-a-v2-block", "plan", v1(cross={"alignment": "greedy"}), "$.cross", "unknown key"),
    F("plan-v1-tiles-list", "plan", v1(tiles=[]), "$.tiles", "should be an object, got a list"),
    F("plan-v1-tiles-unknown-model", "plan", v1(tiles={"oracle": {}}), "$.tiles.oracle", "unknown key"),
    F("plan-v1-fusions-list", "plan", v1(fusions=["lm_head+argmax"]), "$.fusions", "should be an object"),
    F("plan-v1-tile-not-power-of-two", "plan", v1(tiles={"target": {"qkv": {"BLOCK_N": 48}}}),
      "$.target.tiles.qkv.BLOCK_N", "power of two"),
    F("plan-v1-alignment-unknown", "plan", v1(alignment="diagonal"), "$.cross.alignment"),
    F("plan-v1-retired-persist", "plan", v1(persist={"target": {"span": "layer"}}), "$.persist.target.span",
      "retired"),
    F("plan-v1-retired-prefetch", "plan", v1(pdl={"draft": {"trigger": "end", "prefetch": True}}),
      "$.pdl.draft.prefetch", "retired"),

    # -- workloads: plan validate interleave --workload W
    F("workload-malformed", "workload", 'draft = "tiny-llama-d\n', "malformed TOML"),
    F("workload-not-utf8", "workload", b"\xff\xfek = 3\n", "not UTF-8"),
    F("workload-directory", "workload", directory, "is a directory"),
    F("workload-missing", "workload", missing, "no such workload file"),
    F("workload-too-large", "workload", too_large, "larger than 16 MiB"),
    F("workload-arrays-past-the-stack", "workload", workload(x="[" * 100_000 + "]" * 100_000),
      "nested deeper than 32 levels"),
    F("workload-nested-40-levels", "workload", workload(x="[" * 40 + "]" * 40), "nested deeper than 32 levels"),
    F("workload-huge-integer", "workload", workload(seed=HUGE_INT), "an integer of more than 4300 digits"),
    F("workload-impossible-date", "workload", workload(context="2023-02-30"), "malformed TOML"),
    F("workload-seed-past-64-bits", "workload", workload(seed=2**63), "'seed'", "[0, 9223372036854775807]"),
    F("workload-seed-negative", "workload", workload(seed=-1), "'seed'"),
    F("workload-seed-enormous", "workload", workload(seed=10**30), "'seed'"),
    F("workload-seed-float", "workload", workload(seed=1.5), "'seed'"),
    F("workload-seed-infinity", "workload", workload(seed="inf"), "'seed'"),
    F("workload-seed-nan", "workload", workload(seed="nan"), "'seed'"),
    F("workload-k-infinity", "workload", workload(k="inf"), "'k'"),
    F("workload-k-nan", "workload", workload(k="nan"), "'k'"),
    F("workload-k-zero", "workload", workload(k=0), "'k'", "[1, 16]"),
    F("workload-k-past-limit", "workload", workload(k=17), "'k'"),
    F("workload-k-float", "workload", workload(k="3.0"), "'k'"),
    F("workload-k-boolean", "workload", workload(k="true"), "'k'"),
    F("workload-name-empty", "workload", workload(name='""'), "'name'", "printable"),
    F("workload-name-escape", "workload", workload(name='"w\\u001b[2J"'), "'name'", "printable"),
    F("workload-name-newline", "workload", workload(name='"a\\nb"'), "'name'", "printable"),
    F("workload-name-huge", "workload", workload(name='"' + "w" * 5000 + '"'), "'name'", "1 to 200"),
    F("workload-k-string", "workload", workload(k='"3"'), "'k'"),
    F("workload-k-missing", "workload", workload(k=DROP), "missing field 'k'"),
    F("workload-draft-batch-zero", "workload", workload(draft_batch=0), "'draft_batch'"),
    F("workload-target-batch-past-limit", "workload", workload(target_batch=257), "'target_batch'"),
    F("workload-target-batch-negative", "workload", workload(target_batch=-2), "'target_batch'"),
    F("workload-context-negative", "workload", workload(context=-1), "'context'"),
    F("workload-context-huge", "workload", workload(context=10**9), "'context'"),
    F("workload-context-date", "workload", workload(context="1979-05-27"), "'context'"),
    F("workload-dtype-unknown", "workload", workload(dtype='"int8"'), "'dtype'"),
    F("workload-dtype-number", "workload", workload(dtype=16), "'dtype'"),
    F("workload-dtype-array", "workload", workload(dtype='["bf16"]'), "'dtype'"),
    F("workload-kv-init-unknown", "workload", workload(kv_init='"zeros"'), "'kv_init'"),
    F("workload-kv-init-table", "workload", workload(kv_init="{ kind = 'random' }"), "'kv_init'"),
    F("workload-name-table", "workload", workload(name="{ a = 1 }"), "'name'"),
    F("workload-draft-table", "workload", workload(draft="{ preset = 'tiny-llama-d' }"), "'draft'"),
    F("workload-draft-array", "workload", workload(draft='["tiny-llama-d"]'), "'draft'"),
    F("workload-draft-with-nul", "workload", workload(draft='"tiny\\u0000llama"'), "'draft'", "neither"),
    F("workload-draft-unknown", "workload", workload(draft='"llama-9000"'), "'draft'", "neither"),
    F("workload-draft-this-directory", "workload", workload(draft='""'), "'draft'", "config.json"),
    F("workload-draft-vocab-past-target", "workload", workload(draft='"tiny-qwen2-t"', target='"tiny-qwen2-d"'),
      "'draft'", "272", "256"),
    F("workload-unknown-field", "workload", workload(colour='"blue"'), "unknown field 'colour'"),
    F("workload-unknown-field-line-break", "workload", workload(**{'"a\\nb"': 1}), "unknown field 'a\\nb'"),

    # -- evaluator profiles: bench tiny --evaluator P (the profile is read before any plan)
    F("profile-time-limit-zero", "profile", analytical(time_limit_s=0), "'time_limit_s'", "[1, 604800]"),
    F("profile-time-limit-negative", "profile", analytical(time_limit_s=-5), "'time_limit_s'"),
    F("profile-time-limit-infinity", "profile", analytical(time_limit_s="inf"), "'time_limit_s'", "finite"),
    F("profile-time-limit-nan", "profile", analytical(time_limit_s="nan"), "'time_limit_s'", "finite"),
    F("profile-time-limit-huge-float", "profile", analytical(time_limit_s="1e300"), "'time_limit_s'"),
    F("profile-time-limit-past-floats", "profile", analytical(time_limit_s=10**400), "'time_limit_s'"),
    F("profile-time-limit-string", "profile", analytical(time_limit_s='"600"'), "'time_limit_s'"),
    F("profile-time-limit-missing", "profile", analytical(time_limit_s=DROP), "missing field 'time_limit_s'"),
    F("profile-bandwidth-infinity", "profile", analytical(bandwidth_gbs="inf"), "'bandwidth_gbs'", "finite"),
    F("profile-bandwidth-nan", "profile", analytical(bandwidth_gbs="nan"), "'bandwidth_gbs'"),
    F("profile-bandwidth-zero", "profile", analytical(bandwidth_gbs=0), "'bandwidth_gbs'"),
    F("profile-tflops-zero", "profile", analytical(matmul_tflops=0), "'matmul_tflops'"),
    F("profile-tflops-infinity", "profile", analytical(matmul_tflops="inf"), "'matmul_tflops'"),
    F("profile-sms-zero", "profile", analytical(sms=0), "'sms'"),
    F("profile-sms-past-64-bits", "profile", analytical(sms=2**63 - 1), "'sms'"),
    F("profile-sms-float", "profile", analytical(sms=1.5), "'sms'", "int"),
    F("profile-programs-per-sm-zero", "profile", analytical(programs_per_sm=0), "'programs_per_sm'"),
    F("profile-launch-overhead-negative", "profile", analytical(launch_overhead_us=-1), "'launch_overhead_us'"),
    F("profile-launch-overhead-nan", "profile", analytical(launch_overhead_us="nan"), "'launch_overhead_us'"),
    F("profile-colocation-past-one", "profile", analytical(colocation_penalty=2), "'colocation_penalty'"),
    F("profile-streams-overlap-negative", "profile", analytical(streams_overlap=-0.5), "'streams_overlap'"),
    F("profile-streams-overlap-nan", "profile", analytical(streams_overlap="nan"), "'streams_overlap'"),
    F("profile-efficiency-zero", "profile", analytical(gemm=0), "'model.efficiency.gemm'"),
    F("profile-efficiency-nan", "profile", analytical(gemm="nan"), "'gemm'", "finite"),
    F("profile-efficiency-past-one", "profile", analytical(attn=1.5), "'model.efficiency.attn'"),
    F("profile-efficiency-missing", "profile", analytical(elementwise=DROP), "missing field 'elementwise'"),
    F("profile-efficiency-unknown", "profile", analytical(elementwise="0.2\nsimd = 0.5"),
      "unknown field 'model.efficiency.simd'"),
    F("profile-model-gpu-number", "profile", analytical(gpu=3), "'gpu'"),
    F("profile-model-gpu-escape", "profile", analytical(gpu='"H200\\u001b[2J"'), "'gpu'", "printable"),
    F("profile-name-escape", "profile", analytical(name='"a\\u001b]0;pwned\\u0007"'), "'name'", "printable"),
    F("profile-name-empty", "profile", analytical(name='""'), "'name'", "printable"),
    F("profile-name-huge", "profile", analytical(name='"' + "e" * 201 + '"'), "'name'", "1 to 200"),
    F("profile-model-unknown", "profile", analytical(sms="132\ntensor_cores = 4"),
      "unknown field 'model.tensor_cores'"),
    F("profile-model-a-string", "profile", section_as_value(ANALYTICAL, "model", None, '"H200"'),
      "'model' should be a table"),
    F("profile-efficiency-a-number", "profile", ANALYTICAL[:ANALYTICAL.index("[model.efficiency]")]
      .replace("[model]\n", "[model]\nefficiency = 3\n"), "'model.efficiency' should be a table"),
    F("profile-correctness-a-number", "profile", section_as_value(ANALYTICAL, "correctness", "[model]", "1"),
      "'correctness' should be a table"),
    F("profile-max-params-negative", "profile", analytical(max_params=-1), "'max_params'"),
    F("profile-max-params-huge", "profile", analytical(max_params=10**20), "'max_params'"),
    F("profile-max-params-float", "profile", analytical(max_params=1.5), "'max_params'"),
    F("profile-max-params-missing", "profile", analytical(max_params=DROP), "missing field 'max_params'"),
    F("profile-name-number", "profile", analytical(name=3), "'name'"),
    F("profile-description-number", "profile", analytical(description=3), "'description'"),
    F("profile-kind-unknown", "profile", analytical(kind='"quantum"'), "'kind'"),
    F("profile-kind-array", "profile", analytical(kind='["gpu"]'), "'kind'"),
    F("profile-unknown-field", "profile", analytical(colour=1), "unknown field 'colour'"),
    F("profile-unknown-field-line-break", "profile", analytical(**{'"a\\nb"': 1}), "unknown field 'a\\nb'"),
    F("profile-malformed", "profile", "name = \n", "malformed TOML"),
    F("profile-not-utf8", "profile", b"\xff\xfename = 1\n", "not UTF-8"),
    F("profile-arrays-past-the-stack", "profile", analytical(x="[" * 100_000 + "]" * 100_000), "nested deeper"),
    F("profile-huge-integer", "profile", analytical(sms=HUGE_INT), "an integer of more than 4300 digits"),
    F("profile-gpu-device-number", "profile", h200(device=1), "'device'"),
    F("profile-gpu-timing-a-string", "profile", section_as_value(H200, "timing", "[correctness]", '"fast"'),
      "'timing' should be a table"),
    F("profile-gpu-replays-zero", "profile", h200(replays=0), "replays and verdict_calls"),
    F("profile-gpu-replays-huge", "profile", h200(replays=10**7), "'replays'"),
    F("profile-gpu-replays-past-64-bits", "profile", h200(replays=10**30), "'replays'"),
    F("profile-gpu-warmup-negative", "profile", h200(warmup=-1), "'warmup'"),
    F("profile-gpu-verdict-calls-zero", "profile", h200(verdict_calls=0), "replays and verdict_calls"),
    F("profile-gpu-baselines-string", "profile", h200(baselines='"streams"'), "'timing.baselines'"),
    F("profile-gpu-baselines-nested", "profile", h200(baselines='[["streams"]]'), "'timing.baselines'"),
    F("profile-gpu-baselines-twice", "profile", h200(baselines='["streams", "sequential", "streams"]'),
      "'timing.baselines'", "twice"),
    F("profile-gpu-conventional-empty", "profile", h200(baselines="[]\nconventional = []"), "'timing.conventional'"),
    F("profile-gpu-conventional-tables", "profile", h200(baselines="[]\nconventional = [{ a = 1 }]"),
      "'timing.conventional'"),
    F("profile-gpu-tolerance-a-string", "profile", H200.replace("[correctness.bf16]\nrel = 0.05\ntie_margin = 0.2",
                                                                "").replace("max_params =", 'bf16 = "x"\nmax_params ='),
      "'correctness.bf16' should be a table"),
    F("profile-gpu-tolerance-unknown-dtype", "profile", H200.replace("[correctness.bf16]", "[correctness.int8]"),
      "unknown field 'correctness.int8'"),
    F("profile-gpu-rel-zero", "profile", h200(rel=0), "'rel'"),
    F("profile-gpu-rel-nan", "profile", h200(rel="nan"), "'rel'", "finite"),
    F("profile-gpu-rel-infinity", "profile", h200(rel="inf"), "'rel'"),
    F("profile-gpu-tie-margin-negative", "profile", h200(tie_margin=-1), "'tie_margin'"),
    F("profile-gpu-tie-margin-huge", "profile", h200(tie_margin="1e9"), "'tie_margin'"),

    # -- checkpoints: a workload whose draft is a checkpoint directory with this config.json
    F("config-malformed", "config", "{", "malformed JSON"),
    F("config-not-utf8", "config", b"\xff{}", "not UTF-8"),
    F("config-objects-past-the-stack", "config", nested(5000), "nested deeper"),
    F("config-huge-integer", "config", config()[:-1] + ', "x": ' + HUGE_INT + "}", "4300 digits"),
    F("config-a-list", "config", "[1]", "expected a JSON object"),
    F("config-model-type-list", "config", config(model_type=["llama"]), "'model_type'"),
    F("config-model-type-unknown", "config", config(model_type="mistral"), "'model_type'"),
    F("config-hidden-negative", "config", config(hidden_size=-64), "'hidden_size'", "positive"),
    F("config-hidden-zero", "config", config(hidden_size=0), "'hidden_size'"),
    F("config-hidden-absurd", "config", config(hidden_size=10**30), "'hidden_size'", "at most"),
    F("config-hidden-string", "config", config(hidden_size="64"), "'hidden_size'"),
    F("config-hidden-float", "config", config(hidden_size=64.0), "'hidden_size'", "int"),
    F("config-heads-fractional", "config", config(num_attention_heads=4.5), "'num_attention_heads'"),
    F("config-heads-boolean", "config", config(num_attention_heads=True), "'num_attention_heads'"),
    F("config-kv-heads-not-dividing", "config", config(num_key_value_heads=3), "'num_key_value_heads'",
      "does not divide"),
    F("config-kv-heads-past-heads", "config", config(num_key_value_heads=8), "'num_key_value_heads'"),
    F("config-kv-heads-zero", "config", config(num_key_value_heads=0), "'num_key_value_heads'"),
    F("config-layers-absurd", "config", config(num_hidden_layers=10**9), "'num_hidden_layers'", "at most"),
    F("config-vocab-absurd", "config", config(vocab_size=10**12), "'vocab_size'"),
    F("config-vocab-missing", "config", config(vocab_size=DROP), "missing field 'vocab_size'"),
    F("config-ffn-negative", "config", config(intermediate_size=-1), "'intermediate_size'"),
    F("config-head-dim-string", "config", config(head_dim="16"), "'head_dim'"),
    F("config-head-dim-absurd", "config", config(head_dim=4096), "'head_dim'"),
    F("config-eps-nan", "config", config(rms_norm_eps=float("nan")), "'rms_norm_eps'", "finite"),
    F("config-eps-infinity", "config", config(rms_norm_eps=float("inf")), "'rms_norm_eps'"),
    F("config-eps-zero", "config", config(rms_norm_eps=0), "'rms_norm_eps'"),
    F("config-eps-two", "config", config(rms_norm_eps=2.0), "'rms_norm_eps'"),
    F("config-theta-nan", "config", config(rope_theta=float("nan")), "'rope_theta'"),
    F("config-theta-infinity", "config", config(rope_theta=float("inf")), "'rope_theta'"),
    F("config-theta-negative", "config", config(rope_theta=-1), "'rope_theta'"),
    F("config-theta-string", "config", config(rope_theta="big"), "'rope_theta'"),
    F("config-rope-scaling-list", "config", config(rope_scaling=[8]), "'rope_scaling'"),
    F("config-rope-parameters-string", "config", config(rope_parameters="llama3"), "'rope_parameters'"),
    F("config-rope-type-unknown", "config", rope(rope_type="yarn"), "'rope_scaling.rope_type'"),
    F("config-rope-factor-nan", "config", rope(factor=float("nan")), "'rope_scaling.factor'"),
    F("config-rope-factor-negative", "config", rope(factor=-8), "'rope_scaling.factor'"),
    F("config-rope-factor-boolean", "config", rope(factor=True), "'rope_scaling.factor'"),
    F("config-rope-factor-missing", "config", rope(factor=DROP), "'rope_scaling'", "'factor'"),
    F("config-rope-positions-fractional", "config", rope(original_max_position_embeddings=64.5),
      "'rope_scaling.original_max_position_embeddings'"),
    F("config-rope-high-not-above-low", "config", rope(high_freq_factor=1.0), "'rope_scaling.high_freq_factor'"),
    F("config-rope-positions-absurd", "config", rope(original_max_position_embeddings=10**30),
      "'rope_scaling.original_max_position_embeddings'", "at most"),
    F("config-rope-theta-tiny", "config", config(rope_theta=1e-300), "'rope_theta'", "at least 1"),
    F("config-tie-string", "config", config(tie_word_embeddings="yes"), "'tie_word_embeddings'"),
    F("config-attention-bias", "config", config(attention_bias=True), "'attention_bias'"),
    F("config-name-list", "config", config(_name_or_path=["me"]), "'_name_or_path'"),
    F("config-missing", "config", missing, "no such config.json"),

    # -- checkpoints: a sharded checkpoint whose model.safetensors.index.json is this
    F("index-malformed", "index", "{not json", "malformed JSON"),
    F("index-objects-past-the-stack", "index", nested(5000), "nested deeper"),
    F("index-a-list", "index", "[]", "'weight_map'"),
    F("index-weight-map-list", "index", json.dumps({"weight_map": ["model.safetensors"]}), "'weight_map'"),
    F("index-weight-map-number", "index", index({"a": 5}), "'weight_map'"),
    F("index-shard-missing", "index", index({"a": "model-00002-of-00002.safetensors"}),
      "'weight_map'", "model-00002-of-00002.safetensors", "missing"),
    F("index-shard-absolute", "index", index({"a": "/etc/passwd"}), "'weight_map'", "/etc/passwd",
      "checkpoint's folder"),
    F("index-shard-above", "index", index({"a": "../model.safetensors"}), "'weight_map'", "checkpoint's folder"),
    F("index-shard-empty", "index", index({"a": ""}), "'weight_map'", "checkpoint's folder"),
    F("index-shard-nul", "index", index({"a": "model\u0000.safetensors"}), "'weight_map'", "checkpoint's folder"),

    # -- search databases: show DB (and a few through export and search --resume)
    F("database-text-file", "database", b"not a database\n" * 10, "file is not a database"),
    F("database-truncated-header", "database", b"SQLite format 3\x00" + b"\x00" * 50, "file is not a database"),
    F("database-directory", "database", directory, "a directory, not a database file"),
    F("database-missing", "database", missing, "no such database file"),
    F("database-of-another-program", "database", sqlite("CREATE TABLE songs (title text);"), "not a conjugate store"),
    F("database-meta-without-values", "database", sqlite("CREATE TABLE meta (a int);"), "not a conjugate store"),
    F("database-meta-without-version", "database", sqlite("CREATE TABLE meta (key text, value text);"),
      "store schema version unknown"),
    F("database-newer-schema", "database",
      sqlite(f"CREATE TABLE meta (key text, value text); INSERT INTO meta VALUES ('schema_version', "
             f"'{STORE_VERSION + 1}');"),
      f"store schema version {STORE_VERSION + 1}"),
    F("database-current-version-without-tables", "database",
      sqlite(f"CREATE TABLE meta (key text, value text); INSERT INTO meta VALUES ('schema_version', "
             f"'{STORE_VERSION}');"),
      "without its table"),
    F("database-older-schema", "database", damaged("UPDATE meta SET value = '1' WHERE key = 'schema_version'"),
      "store schema version 1"),
    F("database-settings-not-json", "database", damaged("UPDATE runs SET settings = '{not json'"), "cannot be read"),
    F("database-settings-a-string", "database", damaged("UPDATE runs SET settings = '\"x\"'"), "cannot be read"),
    F("database-status-unknown", "database", damaged("UPDATE runs SET status = 'dancing'"), "cannot be read",
      "dancing"),
    F("database-date-unreadable", "database", damaged("UPDATE runs SET created_at = 'yesterday'"), "cannot be read"),
    F("database-plan-not-json", "database", damaged("UPDATE nodes SET plan = '{x'"), "cannot be read"),
    F("database-result-a-list", "database", damaged("UPDATE evaluations SET result = '[1]'"), "unreadable result"),
    F("export-database-of-another-program", "export", sqlite("CREATE TABLE songs (title text);"),
      "not a conjugate store"),
    F("export-database-status-unknown", "export", damaged("UPDATE runs SET status = 'dancing'"), "cannot be read"),
    F("resume-database-text-file", "resume", b"not a database\n" * 10, "file is not a database"),
    F("resume-database-settings-a-string", "resume", damaged("UPDATE runs SET settings = '[]'"), "cannot be read"),

    # -- measured rounds: calibrate --from FILE
    F("measured-malformed", "measured", "{", "malformed JSON"),
    F("measured-not-utf8", "measured", b"\xff\xfe{}", "not UTF-8"),
    F("measured-missing", "measured", missing, "no such measured-rounds file"),
    F("measured-arrays-past-the-stack", "measured", "[" * 100_000 + "]" * 100_000, "nested deeper"),
    F("measured-huge-integer", "measured", measured()[:-1] + ', "x": ' + HUGE_INT + "}", "4300 digits"),
    F("measured-no-workloads", "measured", "{}", "not a measured-rounds file"),
    F("measured-workloads-a-string", "measured", json.dumps({"workloads": "tiny"}), "not a measured-rounds file"),
    F("measured-latency-nan", "measured", measured(float("nan")), "'median_ms'"),
    F("measured-latency-negative", "measured", measured(-1.0), "'median_ms'"),
    F("measured-latency-string", "measured", measured("fast"), "'median_ms'"),
    F("measured-plan-a-number", "measured", measured(plan_name=3), "'plan'"),
    F("measured-plan-a-path", "measured", measured(plan_name="../../etc/passwd"), "should be names (no path)"),
    F("measured-no-rounds", "measured", json.dumps({"workloads": []}), "no measured round"),
]


# -- running a case --------------------------------------------------------------------------

def _command(fault: Fault, tmp: Path) -> tuple[list, Path]:
    """The command that reads the bad file (its other inputs written), and the file the line must name."""
    kind = fault.kind
    if kind == "plan":
        file = tmp / "plan.json"
        return ["plan", "validate", file, "--workload", TINY], file
    if kind == "workload":
        file = tmp / "w.toml"
        return ["plan", "validate", INTERLEAVE, "--workload", file], file
    if kind == "profile":
        file = tmp / "p.toml"
        return ["bench", TINY, "--evaluator", file, "--plan", tmp / "never-read.json"], file
    if kind in ("config", "index"):
        checkpoint(tmp / "ck", sharded=kind == "index")
        (tmp / "w.toml").write_text(workload(draft='"ck"'))
        name = "config.json" if kind == "config" else "model.safetensors.index.json"
        return ["plan", "validate", INTERLEAVE, "--workload", tmp / "w.toml"], tmp / "ck" / name
    if kind in ("database", "export", "resume"):
        file = tmp / "runs.db"
        command = {"database": ["show", file], "export": ["export", file, "--out", tmp / "out"],
                   "resume": ["search", "--resume", file]}[kind]
        return command, file
    file = tmp / "measured.json"
    return ["calibrate", "--from", file, "--out", tmp / "fitted.toml"], file


def checkpoint(directory: Path, sharded: bool = False) -> Path:
    """A checkpoint directory of CONFIG whose one file (model.safetensors, or a shard an index names)
    holds none of the model's tensors: it loads as a workload, its weights never do."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(config())
    name = "model-00001-of-00001.safetensors" if sharded else "model.safetensors"
    save_file({"unrelated": torch.zeros(2)}, str(directory / name))
    return directory


def _write(fault: Fault, file: Path, request) -> None:
    if isinstance(fault.bad, bytes):
        file.write_bytes(fault.bad)
    elif isinstance(fault.bad, str):
        file.write_text(fault.bad)
    elif fault.kind in ("database", "export", "resume"):
        fault.bad(file, request.getfixturevalue("failed_search")["db"])
    else:
        fault.bad(file)


@pytest.mark.parametrize("fault", FAULTS, ids=[f.id for f in FAULTS])
def test_a_bad_file_ends_in_one_line_naming_it(fault, tmp_path, capsys, request):
    argv, file = _command(fault, tmp_path)
    if file.exists():
        file.unlink()  # the checkpoint's good config.json, replaced by the bad one
    _write(fault, file, request)
    code, _, err = run(capsys, *argv)
    line = assert_one_line_error(code, err, str(file), *fault.fragments)
    assert line.startswith("error: ") and len(line) < 1000, line


def test_the_table_covers_every_reader():
    kinds = {f.kind for f in FAULTS}
    assert kinds == {"plan", "workload", "profile", "config", "index", "database", "export", "resume", "measured"}
    assert len(FAULTS) >= 100 and len({f.id for f in FAULTS}) == len(FAULTS)


# -- numbers on the command line --------------------------------------------------------------

@pytest.mark.parametrize("flag,value,fragment", [("--dtype", "int8", "one of bf16, fp16, fp32"),
                                                   ("--draft", "no-such-model", "neither a model preset"),
                                                   ("--target", "no-such-model", "neither a model preset")])
def test_a_generate_model_flag_names_the_flag_not_the_workload_file(flag, value, fragment, capsys):
    code = main(["generate", str(TINY), flag, value, "--prompt-ids", "1,2"])
    line = assert_one_line_error(code, capsys.readouterr().err, f"{flag} '{value}'", fragment)
    assert "tiny.toml" not in line


def test_a_generate_checkpoint_flag_is_relative_to_the_current_directory(tmp_path, monkeypatch, capsys):
    """Not to the workload file's folder: --draft ck beside examples/tiny.toml finds ./ck."""
    checkpoint(tmp_path / "ck")
    (tmp_path / "ck" / "config.json").write_text(config(hidden_size=0))  # refused when it is found
    monkeypatch.chdir(tmp_path)
    code = main(["generate", str(TINY), "--draft", "ck", "--prompt-ids", "1,2"])
    assert_one_line_error(code, capsys.readouterr().err, str(tmp_path / "ck" / "config.json"), "'hidden_size'")


@pytest.mark.parametrize("argv,option", [
    (["search", "--seed", str(2**64)], "--seed"),
    (["search", "--seed", "-1"], "--seed"),
    (["search", "--seed", HUGE_INT], "--seed"),
    (["show", "runs.db", "--run", str(10**30)], "--run"),
    (["search", "--resume", "runs.db", "--run", "0"], "--run"),
    (["search", "--max-llm-cost", "nan"], "--max-llm-cost"),
    (["search", "--max-llm-cost", "-1"], "--max-llm-cost"),
    (["generate", "--k", "0"], "--k"),
    (["generate", "--batch", "-1"], "--batch"),
    (["generate", "--context", "1e3"], "--context"),
    (["profile", "w.toml", "--replays", "-1"], "--replays"),
    (["show", "runs.db", "--limit", "-5"], "--limit"),
    (["search", "--name", "../outside"], "--name"),
    (["search", "--name", "two\nlines"], "--name"),
    (["search", "--budget", "100000000000000000000000"], "--budget"),
    (["search", "--budget", "1000001"], "--budget"),
    (["search", "--width", "65"], "--width"),
    (["show", "runs.db", "--limit", HUGE_INT], "--limit"),
    (["check", "--limit", "10000000000"], "--limit"),
    (["profile", "w.toml", "--replays", "1001"], "--replays"),
    (["generate", "--max-new-tokens", "0"], "--max-new-tokens"),
    (["generate", "--max-new-tokens", "99999999999999999999"], "--max-new-tokens"),
    (["generate", "--k", "17"], "--k"),
    (["generate", "--batch", "100000"], "--batch"),
    (["generate", "--context", "200000"], "--context"),
], ids=["seed-past-64-bits", "seed-negative", "seed-huge", "run-past-64-bits", "run-zero", "cost-nan",
        "cost-negative", "k-zero", "batch-negative", "context-not-an-integer", "profile-replays-negative",
        "show-limit-negative", "name-a-path", "name-with-a-newline", "budget-past-1e23", "budget-past-its-bound",
        "width-past-its-bound", "show-limit-huge", "check-limit-huge", "profile-replays-past-its-bound",
        "new-tokens-zero", "new-tokens-huge", "k-past-the-workload-limit", "batch-past-the-workload-limit",
        "context-past-the-workload-limit"])  # output paths: tests/test_hostile_cli.py
def test_a_bad_number_on_the_command_line_is_a_usage_error(argv, option, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and "Traceback" not in err
    assert len(err.splitlines()) == 1 and err.startswith(f"error: argument {option}"), err


@pytest.mark.parametrize("argv,option", [
    (["search", "--time", "99999999999999999999h"], "--time"),
    (["search", "--time", "31d"], "--time"),
    (["search", "--llm-timeout", "1e300"], "--llm-timeout"),
    (["search", "--gpus", "0,99999999999999999999"], "--gpus"),
], ids=["time-huge", "time-unknown-unit", "llm-timeout-huge", "gpu-index-huge"])
def test_a_bad_duration_or_device_is_one_line_naming_the_option(argv, option, capsys, tmp_path):
    code = main([*argv, "--db", str(tmp_path / "never.db")])
    assert_one_line_error(code, capsys.readouterr().err, option)
    assert not (tmp_path / "never.db").exists()


# -- a search whose every evaluation failed ----------------------------------------------------

@pytest.fixture(scope="module")
def failed_search(tmp_path_factory):
    """A search of 2 evaluations in which every plan comes back incorrect (an evaluation entry that
    says so: tests/faults/evaluators.py), scored by the analytical profile without its numerical check
    (the entry's verdict replaces the check's)."""
    from conjugate.evaluate import worker

    class EveryPlanIncorrect(worker.IsolatedEvaluator):
        def __init__(self, profile, **options):
            faults = str(Path(__file__).parent / "faults")
            super().__init__(profile, entry="evaluators:incorrect_every_plan", **options,
                             env={"PYTHONPATH": os.pathsep.join([faults, os.environ.get("PYTHONPATH", "")])})

    root = tmp_path_factory.mktemp("failed")
    db, fast = root / "runs.db", root / "fast.toml"
    fast.write_text(analytical(max_params=0))
    out, err = io.StringIO(), io.StringIO()
    with pytest.MonkeyPatch.context() as patch, contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        patch.setenv("CONJUGATE_CACHE", str(root / "cache"))
        patch.setattr(worker, "IsolatedEvaluator", EveryPlanIncorrect)
        code = main(["search", str(TINY), "--db", str(db), "--budget", "2", "--evaluator", str(fast)])
    return {"code": code, "out": out.getvalue(), "err": err.getvalue(), "db": db}


def test_a_search_whose_every_evaluation_failed_says_so_and_exits_1(failed_search):
    assert failed_search["code"] == 1, failed_search["out"] + failed_search["err"]
    assert "Traceback" not in failed_search["err"]
    status = [line for line in failed_search["out"].splitlines() if line.startswith("search ")]
    assert len(status) == 1 and "finished (budget) after 2 evaluations" in status[0]
    assert "no evaluation succeeded" in status[0]
    assert "0 ok, 2 failed" in failed_search["out"]


def test_a_search_with_a_working_plan_exits_0(tmp_path, monkeypatch):
    fast = tmp_path / "fast.toml"
    fast.write_text(analytical(max_params=0))  # modeled only: no round is run
    monkeypatch.setenv("CONJUGATE_CACHE", str(tmp_path / "cache"))
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        code = main(["search", str(EXAMPLES / "tiny.toml"), "--db", str(tmp_path / "ok.db"), "--budget", "1",
                     "--evaluator", str(fast)])
    assert code == 0, out.getvalue()
    assert "no evaluation succeeded" not in out.getvalue()
