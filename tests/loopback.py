"""A scripted loopback HTTP server speaking the OpenAI and Anthropic chat wire protocols.

Each request takes the next scripted response (status + JSON body, optionally after a delay longer
than the client's timeout) and is recorded with its path, headers and JSON body, so tests drive
the real SDK clients and then inspect exactly what went over the wire.
"""
from __future__ import annotations

import json
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclass
class Scripted:
    status: int
    body: dict
    delay_s: float = 0.0
    headers: dict = field(default_factory=dict)


@dataclass
class Request:
    path: str
    headers: dict  # lower-case names
    body: dict

    def text(self) -> str:
        """Every text the request carries (system prompt and messages), joined."""
        parts = [self.body.get("system") or ""]
        parts += [m.get("content") if isinstance(m.get("content"), str) else json.dumps(m.get("content"))
                  for m in self.body.get("messages", [])]
        return "\n".join(parts)


def openai_reply(text: str, prompt_tokens: int = 120, completion_tokens: int = 30) -> dict:
    return {"id": "chatcmpl-loopback", "object": "chat.completion", "created": int(time.time()),
            "model": "loopback-model",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                      "total_tokens": prompt_tokens + completion_tokens}}


def anthropic_reply(text: str, input_tokens: int = 120, output_tokens: int = 30) -> dict:
    return {"id": "msg_loopback", "type": "message", "role": "assistant", "model": "loopback-model",
            "content": [{"type": "text", "text": text}], "stop_reason": "end_turn", "stop_sequence": None,
            "usage": {"input_tokens": input_tokens, "output_tokens": output_tokens}}


def error_body(provider: str, status: int, message: str) -> dict:
    if provider == "anthropic":
        kind = {401: "authentication_error", 429: "rate_limit_error"}.get(status, "api_error")
        return {"type": "error", "error": {"type": kind, "message": message}}
    return {"error": {"message": message, "type": "server_error" if status >= 500 else "invalid_request_error",
                      "param": None, "code": None}}


class Loopback:
    """`with Loopback("openai") as server:` ... server.base_url, server.push(...), server.requests."""

    def __init__(self, provider: str):
        self.provider = provider
        self.path = "/v1/chat/completions" if provider == "openai" else "/v1/messages"
        self.script: deque[Scripted] = deque()
        self.requests: list[Request] = []
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self._server.block_on_close = False
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.05,), daemon=True)

    @property
    def base_url(self) -> str:
        port = self._server.server_address[1]
        return f"http://127.0.0.1:{port}/v1" if self.provider == "openai" else f"http://127.0.0.1:{port}"

    def push(self, status: int, body: dict, delay_s: float = 0.0, headers: dict | None = None) -> None:
        self.script.append(Scripted(status, body, delay_s, headers or {}))

    def reply(self, text: str, **usage) -> None:
        """A successful chat reply carrying `text`."""
        make = openai_reply if self.provider == "openai" else anthropic_reply
        self.push(200, make(text, **usage))

    def fail(self, status: int, message: str = "scripted failure") -> None:
        self.push(status, error_body(self.provider, status, message))

    def stall(self, delay_s: float) -> None:
        """Answer only after delay_s (longer than the client's timeout)."""
        self.push(200, {}, delay_s=delay_s)

    def __enter__(self) -> "Loopback":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()

    def _take(self, request: Request) -> Scripted:
        """Record the request; answer with the next scripted response (404 off the API's path)."""
        with self._lock:
            self.requests.append(request)
            if request.path != self.path:
                return Scripted(404, error_body(self.provider, 404, f"no route {request.path}"))
            if self.script:
                return self.script.popleft()
            return Scripted(500, error_body(self.provider, 500, "nothing scripted for this request"))

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers.get("content-length") or 0))
                request = Request(self.path, {k.lower(): v for k, v in self.headers.items()}, json.loads(raw or b"{}"))
                scripted = server._take(request)
                if scripted.delay_s:
                    time.sleep(scripted.delay_s)
                payload = json.dumps(scripted.body).encode()
                try:
                    self.send_response(scripted.status)
                    for name, value in {"content-type": "application/json", **scripted.headers}.items():
                        self.send_header(name, value)
                    self.send_header("content-length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up waiting

            def log_message(self, *args) -> None:  # keep test output quiet
                pass

        return Handler
