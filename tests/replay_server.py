"""A scripted OpenAI-compatible chat server on loopback, for the generation tests.

It is a real HTTP server (tests/server_fixture.fake_server runs it in a thread), answering
GET /v1/models and POST /v1/chat/completions from a script, so the client under test meets
real sockets, real SSE framing and real timeouts. Every request is recorded.

A step is what the server does for one chat request:
  - a str: reply with that text (200, usage included, streamed if the request asked);
  - a dict: {"text", "status" (200), "body" (str/bytes/dict sent as is instead of a reply),
    "content_type", "headers" (extra response headers), "delay_s" (wait before answering;
    cut short when the server stops), "stream" (None: as the request asked), "usage" (dict;
    None: none sent; absent: counted in words), "finish_reason" ("stop"), "chunk_chars"
    (characters per streamed delta, 16), "ping_s" (streamed: keep-alive comments for that
    long before the first delta)};
  - a callable (request_json) -> step.

Which step answers a request, first match wins:
  1. `by_content`: {substring: step} matched against the last user message (not consumed,
     so concurrent conversations replay deterministically);
  2. `by_model`: {model: [steps]}: that model's own queue, consumed in order;
  3. `script`: the shared queue, consumed in order (or one callable answering everything).
A model missing from `by_model` (with no shared script) gets a 404 like a real server; an
exhausted queue gets a 400 naming the request number, so a test sees it at once.

    with replay_server(["first reply", {"status": 500}, "third"]) as srv:
        client = ChatClient(srv.url)
        ...
        assert srv.requests[0]["messages"][-1]["content"] == "..."
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tests.server_fixture import FakeHandler, fake_server

Step = str | dict[str, Any] | Callable[[dict[str, Any]], Any]  # a callable returns a Step
DEFAULT_MODEL = "replay-model"


@dataclass
class Call:
    """One HTTP request as the server received it."""

    method: str
    path: str
    headers: dict[str, str]  # names lower-cased
    json: Any = None  # the parsed body (None for GET, or a body that is not JSON)


@dataclass
class ReplayServer:
    url: str  # base URL ending /v1
    models: list[str]
    calls: list[Call] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def requests(self) -> list[dict[str, Any]]:
        """The JSON bodies of the chat completion requests, in arrival order."""
        with self._lock:
            return [c.json for c in self.calls if c.path.endswith("/chat/completions")]

    @property
    def headers(self) -> list[dict[str, str]]:
        """The headers of every request (models and chat), in arrival order."""
        with self._lock:
            return [c.headers for c in self.calls]


@dataclass
class _Script:
    server: ReplayServer
    queue: list[Step] | Callable[[dict[str, Any]], Step]
    by_model: dict[str, list[Step]]
    by_content: dict[str, Step]
    served: int = 0

    def step_for(self, request: dict[str, Any]) -> Step:
        with self.server._lock:
            self.served += 1
            step = self._pick(request)
        while callable(step):
            step = step(request)
        return step

    def _pick(self, request: dict[str, Any]) -> Step:
        last = _last_user(request)
        for needle, step in self.by_content.items():
            if needle in last:
                return step
        model = str(request.get("model"))
        if model in self.by_model:
            return self._next(self.by_model[model], f"model {model}'s script")
        if callable(self.queue):
            return self.queue
        if self.by_model and not self.queue:
            return {"status": 404, "body": {"error": {"message": f"model '{model}' not found",
                                                      "code": "model_not_found"}}}
        return self._next(self.queue, "the script")

    def _next(self, queue: list[Step], what: str) -> Step:
        if queue:
            return queue.pop(0)
        return {"status": 400, "body": {"error": {
            "message": f"replay: {what} is exhausted at request {self.served}"}}}


def _last_user(request: dict[str, Any]) -> str:
    for message in reversed(request.get("messages") or []):
        if isinstance(message, dict) and message.get("role") == "user":
            return str(message.get("content", ""))
    return ""


class _ReplayHandler(FakeHandler):
    script: _Script

    def do_GET(self) -> None:
        self._record(None)
        if self.path == "/v1/models":
            data = [{"id": m, "object": "model", "owned_by": "replay"}
                    for m in self.script.server.models]
            self._send_body(200, {"object": "list", "data": data})
        else:
            self._send_body(404, {"error": {"message": f"no route {self.path}"}})

    def do_POST(self) -> None:
        raw = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        try:
            request = json.loads(raw)
        except ValueError:
            request = None
        self._record(request)
        if self.path != "/v1/chat/completions" or not isinstance(request, dict):
            self._send_body(404, {"error": {"message": f"no route {self.path}"}})
            return
        step = self.script.step_for(request)
        step = {"text": step} if isinstance(step, str) else dict(step)
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # client gave up
            self._answer(request, step)

    def _record(self, body: Any) -> None:
        call = Call(self.command, self.path, {k.lower(): v for k, v in self.headers.items()},
                    body)
        with self.script.server._lock:
            self.script.server.calls.append(call)

    def _answer(self, request: dict[str, Any], step: dict[str, Any]) -> None:
        if step.get("delay_s") and self.release.wait(step["delay_s"]):
            return  # the server is stopping: a test's hung request need not be answered
        status = int(step.get("status", 200))
        if "body" in step or status >= 400:
            self._send_body(status, step.get("body", {"error": {"message": f"HTTP {status}"}}),
                            step.get("content_type"), step.get("headers"))
            return
        stream = step.get("stream")
        if stream is None:
            stream = bool(request.get("stream"))
        text = str(step.get("text", ""))
        usage = step["usage"] if "usage" in step else _word_usage(request, text)
        model = str(request.get("model"))
        if stream:
            self._send_stream(step, model, text, usage)
        else:
            message = {"role": "assistant", "content": text}
            body: dict[str, Any] = {
                "id": "replay", "object": "chat.completion", "model": model,
                "choices": [{"index": 0, "message": message,
                             "finish_reason": step.get("finish_reason", "stop")}]}
            if usage is not None:
                body["usage"] = usage
            self._send_body(status, body, step.get("content_type"), step.get("headers"))

    def _send_body(self, status: int, body: Any, content_type: str | None = None,
                   headers: Mapping[str, str] | None = None) -> None:
        if isinstance(body, (dict, list)):
            data = json.dumps(body).encode()
            content_type = content_type or "application/json"
        else:
            data = body if isinstance(body, bytes) else str(body).encode()
            content_type = content_type or "text/plain"
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)

    def _send_stream(self, step: dict[str, Any], model: str, text: str,
                     usage: dict[str, Any] | None) -> None:
        # No Content-Length: the stream ends when the server closes the connection.
        self.send_response(int(step.get("status", 200)))
        self.send_header("Content-Type", step.get("content_type", "text/event-stream"))
        self.send_header("Connection", "close")
        for name, value in (step.get("headers") or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.close_connection = True
        ping_until = step.get("ping_s", 0.0)
        while ping_until > 0 and not self.release.wait(0.05):
            self.wfile.write(b": ping\n\n")
            self.wfile.flush()
            ping_until -= 0.05
        n = max(1, int(step.get("chunk_chars", 16)))
        events = [{"delta": {"role": "assistant", "content": ""}}]
        events += [{"delta": {"content": text[i:i + n]}} for i in range(0, len(text), n)]
        events.append({"delta": {}, "finish_reason": step.get("finish_reason", "stop")})
        out = [_event({"model": model, "choices": [dict(index=0, **e)]}) for e in events]
        if usage is not None:  # the final usage-only chunk (stream_options.include_usage)
            out.append(_event({"model": model, "choices": [], "usage": usage}))
        out.append(b"data: [DONE]\n\n")
        self.wfile.write(b"".join(out))
        self.wfile.flush()


def _event(data: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(data).encode() + b"\n\n"


def _word_usage(request: dict[str, Any], text: str) -> dict[str, int]:
    """A deterministic stand-in for token counts: words in, words out."""
    words_in = sum(len(str(m.get("content", "")).split()) for m in request.get("messages", [])
                   if isinstance(m, dict))
    words_out = len(text.split())
    return {"prompt_tokens": words_in, "completion_tokens": words_out,
            "total_tokens": words_in + words_out}


@contextlib.contextmanager
def replay_server(script: Sequence[Step] | Callable[[dict[str, Any]], Step] = (), *,
                  models: Sequence[str] | None = None,
                  by_model: Mapping[str, Sequence[Step]] | None = None,
                  by_content: Mapping[str, Step] | None = None) -> Iterator[ReplayServer]:
    """Serve `script` on a free loopback port; yields the ReplayServer (url, calls, ...).

    `models` defaults to the `by_model` keys, else ["replay-model"].
    """
    names = list(models or by_model or [DEFAULT_MODEL])
    server = ReplayServer(url="", models=names)
    queue = script if callable(script) else list(script)
    plan = _Script(server, queue, {m: list(s) for m, s in (by_model or {}).items()},
                   dict(by_content or {}))
    handler = type("ReplayHandler", (_ReplayHandler,), {"script": plan})
    with fake_server(handler) as url:
        server.url = url
        yield server
