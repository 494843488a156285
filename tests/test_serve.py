"""`conjugate serve`: the official `openai` client against real server processes on checkpoints
transformers wrote, with a byte-level tokenizer (multi-byte characters split across tokens) and a
chat template. At temperature 0 the text is transformers' greedy decoding for eight concurrent
clients, in both modes (a compiled plan pipelined; torch's execution simple); streamed chunks join
to the same text; stop strings and the checkpoint's end-of-sequence id end a completion where
transformers' would; every bad request gets a 4xx while other clients keep being served."""
from __future__ import annotations

import json
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import warnings
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")
openai = pytest.importorskip("openai")
from test_generate import LAYERS, _perturbed, _workload, small_tiled  # noqa: E402,F401
from test_reference_hf import _make_model, _save  # noqa: E402

CHAT_TEMPLATE = ("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}"
                 "{% if add_generation_prompt %}<assistant>{% endif %}")
PROMPTS = ["a", "héllo wörld", "The cat sat on the mat", "✓✓", "0123456789 abcdefghij", "zz", "Ünïcödé", "x y"]
NEW = 6
EOS_PROMPT = "The cat sat on the mat"


def _byte_tokenizer():
    from tokenizers import decoders, models, pre_tokenizers

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())  # 256 symbols: the models' vocabulary
    tok = tokenizers.Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(alphabet)}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    return tok


def _hf(target, ids: list[int], new: int, eos: int | None) -> list[int]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = target.generate(torch.tensor([ids]), max_new_tokens=new, do_sample=False, eos_token_id=eos,
                              pad_token_id=0)[0, len(ids):].tolist()
    return out[:out.index(eos) + 1] if eos in out else out


class Checkpoints:
    """A qwen3 target and a draft close to it, with a tokenizer and chat template; the target's
    generation_config names an end-of-sequence id that EOS_PROMPT's greedy decoding reaches."""

    def __init__(self, root: Path):
        self.tok = _byte_tokenizer()
        self.target = _make_model("qwen3", seed=9, layers=LAYERS)
        self.eos = _hf(self.target, self.encode(EOS_PROMPT), NEW, None)[2]
        for name, model in (("target", self.target), ("draft", _perturbed(self.target, 3))):
            _save(model, root / name)
            self.tok.save(str(root / name / "tokenizer.json"))
            (root / name / "tokenizer_config.json").write_text(json.dumps(
                {"chat_template": CHAT_TEMPLATE, "tokenizer_class": "PreTrainedTokenizerFast"}))
        (root / "target" / "generation_config.json").write_text(json.dumps({"eos_token_id": self.eos}))
        self.workload = _workload(root, "draft", "target", k=2, draft_batch=4, target_batch=4, context=48)

    def encode(self, text: str) -> list[int]:
        return self.tok.encode(text, add_special_tokens=False).ids

    def greedy(self, text: str, new: int = NEW) -> tuple[list[int], str]:
        """transformers' greedy ids (up to the end-of-sequence id) and their text without it."""
        ids = _hf(self.target, self.encode(text), new, self.eos)
        return ids, self.tok.decode([i for i in ids if i != self.eos])


class Server:
    """A `conjugate serve` process on a free port (--port 0), ready once it prints its URL."""

    def __init__(self, workload: str, *flags: str):
        self.process = subprocess.Popen([sys.executable, "-m", "conjugate", "serve", workload, "--port", "0",
                                         "--model-name", "pair", *flags],
                                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        said = ""
        for line in self.process.stdout:  # --port 0: the port it took is in its "serving ... on URL" line
            said += line
            if found := re.search(r" on http://127\.0\.0\.1:(\d+)/v1$", line.rstrip()):
                self.port = int(found[1])
                break
        else:
            self.close()
            pytest.fail(f"conjugate serve did not start: {said}")
        self.url = f"http://127.0.0.1:{self.port}"
        urllib.request.urlopen(self.url + "/health", timeout=10)  # listening since before it compiled
        self.client = openai.OpenAI(base_url=self.url + "/v1", api_key="unused", max_retries=0, timeout=120)

    def stats(self) -> dict:
        return json.loads(urllib.request.urlopen(self.url + "/v1/stats", timeout=5).read())

    def post(self, path: str, body: bytes, headers: dict | None = None) -> tuple[int, dict]:
        request = urllib.request.Request(self.url + path, data=body, method="POST",
                                         headers={"content-type": "application/json"} | (headers or {}))
        try:
            with urllib.request.urlopen(request, timeout=30) as reply:
                return reply.status, json.loads(reply.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read())

    def close(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(20)
        except subprocess.TimeoutExpired:
            self.process.kill()


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return Checkpoints(tmp_path_factory.mktemp("serve"))


@pytest.fixture(scope="module")
def simple(ckpt):
    server = Server(ckpt.workload, "--plan", "conventional", "--variants", "eager-sdpa/eager-sdpa", "--mode", "simple")
    yield server
    server.close()


@pytest.fixture(scope="module")
def pipelined(ckpt, small_tiled):
    server = Server(ckpt.workload, "--plan", small_tiled("interleave"), "--mode", "pipelined")
    yield server
    server.close()


def _complete(server: Server, prompt: str, stream: bool, **options) -> tuple[str, list[int], str]:
    """(text, token ids, finish reason) of one completion, streamed or not."""
    options = dict(model="pair", prompt=prompt, max_tokens=NEW, temperature=0) | options
    if not stream:
        reply = server.client.completions.create(**options)
        choice = reply.choices[0]
        assert reply.usage.completion_tokens == len(choice.token_ids)
        return choice.text, choice.token_ids, choice.finish_reason
    text, ids, finish, usage = "", [], None, None
    for chunk in server.client.completions.create(stream=True, stream_options={"include_usage": True}, **options):
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            text += choice.text
            ids += choice.token_ids
            finish = choice.finish_reason or finish
    assert usage is not None and usage.completion_tokens == len(ids)
    return text, ids, finish


@pytest.mark.parametrize("mode", ["simple", "pipelined"])
def test_eight_concurrent_clients_get_transformers_greedy_text(ckpt, mode, request):
    server = request.getfixturevalue(mode)
    results = [None] * len(PROMPTS)

    new = NEW if mode == "simple" else 4  # the compiled round runs under the interpreter: fewer rounds

    def client(i: int) -> None:
        results[i] = _complete(server, PROMPTS[i], stream=i % 2 == 1, max_tokens=new)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(len(PROMPTS))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    for prompt, (text, ids, finish) in zip(PROMPTS, results):
        want_ids, want_text = ckpt.greedy(prompt, new)
        assert (ids, text) == (want_ids, want_text), (mode, prompt)
        assert finish == ("stop" if ckpt.eos in ids else "length")
    assert any(ckpt.eos in r[1] for r in results)  # EOS_PROMPT ended at the end-of-sequence id


def test_stop_strings_end_the_text_before_them_streamed_or_not(ckpt, simple):
    ids, text = ckpt.greedy("héllo wörld", 10)
    stop = text[3:5]  # found first at 3 at the earliest (it may occur before: find says where)
    for stream in (False, True):
        got, _, finish = _complete(simple, "héllo wörld", stream, max_tokens=10, stop=[stop, "never"])
        assert got == text[:text.find(stop)] and finish == "stop"
    # ignore_eos: the end-of-sequence id does not end it; max_tokens does
    got, got_ids, finish = _complete(simple, EOS_PROMPT, False, extra_body={"ignore_eos": True})
    assert len(got_ids) == NEW and finish == "length" and got_ids[:3] == ckpt.greedy(EOS_PROMPT)[0][:3]


def test_token_id_prompts_seeds_and_chat(ckpt, simple):
    ids = ckpt.encode("x y")
    assert _complete(simple, ids, False)[1] == ckpt.greedy("x y")[0]
    sampled = [_complete(simple, "The", False, temperature=1.0, seed=s)[1] for s in (5, 5, 6)]
    assert sampled[0] == sampled[1] != sampled[2]
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi ✓"}]
    hf = transformers.AutoTokenizer.from_pretrained(Path(ckpt.workload).parent / "target")
    rendered = hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    reply = simple.client.chat.completions.create(model="pair", messages=messages, max_tokens=NEW, temperature=0)
    assert reply.choices[0].message.content == ckpt.greedy(rendered)[1]
    streamed = "".join(c.choices[0].delta.content or "" for c in simple.client.chat.completions.create(
        model="pair", messages=messages, max_tokens=NEW, temperature=0, stream=True) if c.choices)
    assert streamed == reply.choices[0].message.content


def _oversized(server: Server, chunked: bool) -> bytes:
    """Send an 11 MB body (declared, or in 1 MB chunks of undeclared length) as far as the server
    reads it; -> the start of its reply."""
    framing = b"Transfer-Encoding: chunked" if chunked else f"Content-Length: {11 << 20}".encode()
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as conn:
        conn.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n" + framing
                     + b"\r\n\r\n")
        try:
            for _ in range(11):
                block = b" " * (1 << 20)
                conn.sendall(b"%x\r\n%s\r\n" % (len(block), block) if chunked else block)
        except OSError:  # the server answered and closed before the whole body went
            pass
        return conn.recv(64)


def _wait_for(condition, seconds: float = 30) -> None:
    deadline = time.monotonic() + seconds
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.05)


def test_bad_requests_get_4xx_while_other_clients_are_served(ckpt, simple):
    results = {}
    worker = threading.Thread(target=lambda: results.setdefault(
        "ok", [_complete(simple, PROMPTS[2], stream=True) for _ in range(3)]))
    worker.start()
    cases = [(dict(model="nope"), openai.NotFoundError, "model"), (dict(max_tokens=-1), openai.BadRequestError,
                                                                   "max_tokens"),
             (dict(max_tokens=1 << 40), openai.BadRequestError, "max_tokens"),
             (dict(prompt="q" * 60), openai.BadRequestError, "max_tokens"),  # past the KV capacity (48)
             (dict(top_p=0), openai.BadRequestError, "top_p"), (dict(n=2), openai.BadRequestError, "n"),
             (dict(prompt=[1, 256]), openai.BadRequestError, "prompt")]
    for options, error, param in cases:
        with pytest.raises(error) as refused:
            simple.client.completions.create(**(dict(model="pair", prompt="a", max_tokens=2) | options))
        assert 400 <= refused.value.status_code < 500 and refused.value.body["param"] == param, options
    assert simple.post("/v1/completions", b'{"model": "pair", "prompt": ')[0] == 400
    status, body = simple.post("/v1/completions", b'{"model": "pair", "prompt": "a", "temperature": NaN}')
    assert status == 400 and body["error"]["param"] == "temperature"  # the client library cannot send NaN
    for chunked in (False, True):  # a 413 from the declared length, or while the body is read
        assert _oversized(simple, chunked).startswith(b"HTTP/1.1 413")
    worker.join(300)
    want = ckpt.greedy(PROMPTS[2])
    assert [(r[1], r[0]) for r in results["ok"]] == [want] * 3
    # a client that goes away, mid-stream or waiting for a whole completion: its request is cancelled
    for stream in (True, False):
        cancelled = simple.stats()["finished"]["cancelled"]
        with socket.create_connection(("127.0.0.1", simple.port), timeout=30) as conn:
            body = json.dumps({"model": "pair", "prompt": "a", "max_tokens": 40, "stream": stream,
                               "ignore_eos": True}).encode()
            conn.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                         b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
            _wait_for(lambda: simple.stats()["running"] == 1)  # admitted (nothing else runs now), then gone
        _wait_for(lambda: simple.stats()["finished"]["cancelled"] == cancelled + 1)
        stats = simple.stats()
        assert stats["finished"]["cancelled"] == cancelled + 1 and stats["running"] == 0, (stream, stats)
    assert simple.process.poll() is None
    assert _complete(simple, "a", False)[1] == ckpt.greedy("a")[0]  # still serving


# ---------------------------------------------------------------------------------------------
# in-process: the text layer, the Python API, a model without a tokenizer or chat template


def test_text_never_splits_a_character_and_stops_across_pieces(ckpt):
    from conjugate.serving.text import TextStream

    ids = ckpt.encode("héllo ✓ wörld")
    stream = TextStream(ckpt.tok, stop=("wö",))
    pieces = [stream.push([i]) for i in ids]  # one id at a time: multi-byte characters span several
    assert "\ufffd" not in "".join(pieces) and "".join(pieces) == "héllo ✓ " and stream.stopped
    assert stream.finish() == ""
    held = TextStream(ckpt.tok, stop=("lo!",), hidden_ids=(ids[0],))
    assert held.push(ids[:5]) == "él"  # "lo" might begin the stop string: held back; the hidden id dropped
    assert held.finish() == "l"
    for chunks in ([ids[:1], ids[1:3], ids[3:]], [ids]):  # overlapping stops: one cut however ids arrive
        stream = TextStream(ckpt.tok, stop=("l", "éll"))
        assert "".join(stream.push(c) for c in chunks) + stream.finish() == "hé"


def test_the_python_api_and_a_server_for_a_model_without_tokenizer(ckpt):
    import asyncio

    import uvicorn

    from conjugate.evaluate.baselines.conventional import Variant
    from conjugate.paths import DEFAULT_WORKLOAD
    from conjugate.serving.completions import Completions
    from conjugate.serving.http import create_app
    from conjugate.workload import load_workload

    variants = (Variant.parse("eager-sdpa"),) * 2
    with Completions.build(load_workload(ckpt.workload), "conventional", "simple", variants=variants) as service:
        done = service.complete("x y", max_tokens=NEW)
        assert (done.token_ids, done.text, done.finish_reason) == (*ckpt.greedy("x y"), "length")
        assert done.usage.prompt_tokens == len(ckpt.encode("x y")) and done.usage.total_tokens == 3 + NEW
        text = ckpt.greedy("héllo wörld", 10)[1]
        pieces = list(service.stream("héllo wörld", max_tokens=10, stop=text[3]))
        assert "".join(p.text for p in pieces) == text[:text.index(text[3])]
        assert pieces[-1].finish_reason == "stop"

    service = Completions.build(load_workload(DEFAULT_WORKLOAD), "conventional", "simple", variants=variants)
    app = create_app(service, chat=None)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="error"))
    thread = threading.Thread(target=lambda: asyncio.run(server.serve()), daemon=True)
    with service:
        thread.start()
        while not server.started:
            time.sleep(0.05)
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0)
        reply = client.completions.create(model=service.model, prompt=[1, 2, 3], max_tokens=3, temperature=0)
        assert reply.choices[0].text == "" and len(reply.choices[0].token_ids) == 3
        with pytest.raises(openai.BadRequestError) as refused:  # no tokenizer: text cannot be read
            client.completions.create(model=service.model, prompt="hello", max_tokens=3)
        assert refused.value.body["param"] == "prompt"
        with pytest.raises(openai.NotFoundError):  # no chat template
            client.chat.completions.create(model=service.model, messages=[{"role": "user", "content": "hi"}])
        server.should_exit = True
        thread.join(10)


def test_a_signal_ends_open_streams_at_once_and_the_server_exits_cleanly(ckpt):
    server = Server(ckpt.workload, "--plan", "conventional", "--variants", "eager-sdpa/eager-sdpa", "--mode", "simple")
    try:
        stream = iter(server.client.completions.create(model="pair", prompt="a", max_tokens=40, temperature=0,
                                                       stream=True, extra_body={"ignore_eos": True}))
        ids = list(next(stream).choices[0].token_ids)
        asked = time.monotonic()
        server.process.send_signal(signal.SIGTERM)
        finish = None
        for chunk in stream:
            for choice in chunk.choices:
                ids += choice.token_ids
                finish = choice.finish_reason or finish
        code = server.process.wait(30)
        took = time.monotonic() - asked
        said = server.process.stdout.read()
    finally:
        server.close()
    # cut short (not max_tokens, nor an end-of-sequence id: they are ignored), well inside uvicorn's 5 s of grace
    assert finish == "stop" and len(ids) < 40 and took < 4, (finish, len(ids), took)
    assert code == 0 and said.strip().endswith("stopped"), said


def test_a_taken_port_is_refused_in_one_line_before_any_model_loads(ckpt):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = subprocess.run([sys.executable, "-m", "conjugate", "serve", ckpt.workload, "--port", str(port),
                               "--plan", "conventional", "--variants", "eager-sdpa/eager-sdpa"],
                              capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and proc.stdout == ""
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "--port" in lines[0] and str(port) in lines[0], proc.stderr
